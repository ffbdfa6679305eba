-- remax.run.folder: the folder a training run writes (runs/<name>/): resolved config, metrics and
-- completions as JSON lines, crash-safe checkpoints for exact resume, plots. See docs/runs.md.
--
--   local run = require("remax.run.folder").open("runs/gsm8k", { config = cfg, resume = true })
--   local dir, step = run:latest_checkpoint()
--   if dir then local state, tensors, model_dir = run:load_checkpoint(dir) end
--   run:log_metrics(step, { reward = 0.4, kl = 0.01 })
--   run:save_checkpoint(step, model, { tensors = opt:state().tensors, sampler = s:state() })
--   run:plot()
--
-- Every file is written under a temporary name, fsynced and renamed; a checkpoint is built in a
-- temporary folder that is renamed into place, so a crash never leaves half a checkpoint where a
-- good one was. Leftover temporary folders are removed the next time the run is opened.
local cjson = require("cjson").new()   -- a private instance: its settings do not leak to others

local M = {}
local Run = {}
Run.__index = Run
M.Run = Run

---------------------------------------------------------------------------------------------
-- POSIX through the FFI (Linux layouts). Each declaration on its own so that one already made
-- by another module does not stop the rest.
local fs = require("remax.bind.fs")
local is_dir, file_exists, list_dir, mkdir_p, remove_tree = fs.is_dir, fs.exists, fs.list_dir, fs.mkdir_p, fs.remove_tree
local fsync_path, dirname, read_text = fs.fsync_path, fs.dirname, fs.read_text
-- fs.write_atomic, its failure (a full disk: path and errno) told without remax's source positions
local function write_atomic(path, text)
  local ok, err = pcall(fs.write_atomic, path, text)
  if not ok then error((tostring(err):gsub("[%w_%.%-/]*%.lua:%d+: ", "")), 0) end
end
M.fs = fs

-- A message without the Lua source positions ("lua/remax/run/folder.lua:444: ") that errors
-- raised inside remax carry: a full disk or a read-only folder is the user's to fix, and a place
-- in remax's source only hides the path and errno that matter (issue 35).
function M.without_positions(msg)
  return (tostring(msg):gsub("[%w_%.%-/]*%.lua:%d+: ", ""))
end

-- JSON lines (remax.formats.json): the strict encoder, and a decoder that revives NaN/inf.
local json = require("remax.formats.json")
M.encode, M.decode, M.read_jsonl = json.encode, json.decode, json.read_jsonl

---------------------------------------------------------------------------------------------
-- The run folder.

local CHECKPOINTS = "checkpoints"
local TMP_PREFIX, OLD_PREFIX = ".tmp-step-", ".old-step-"

local function positive_int_or_nil(v, what)
  if v == nil or v == cjson.null then return nil end
  if type(v) ~= "number" or v ~= math.floor(v) or v < 1 then
    error(("runs.open: %s = %s, expected a positive integer or nil (keep all)"):format(what, tostring(v)), 3)
  end
  return v
end

local function check_step(step, fn)
  if type(step) ~= "number" or step ~= math.floor(step) or step < 0 then
    error(("runs: %s: step = %s, expected an integer >= 0"):format(fn, tostring(step)), 3)
  end
end

-- Opens (creating) a run folder. opts:
--   config            the resolved config, written to config.json (functions become strings)
--   resume            continue an existing run: torn last lines are dropped, and rows past the
--                     checkpoint that load_checkpoint reads (step 0 when there is none) too
--   report_to         {"tensorboard", "csv", "none", "all"}: also write event files / metrics.csv
--   overwrite         start afresh in a folder that holds an earlier run (removes its metrics,
--                     completions, checkpoints and plots)
--   save_total_limit  newest checkpoints to keep (default config.save_total_limit; nil = all)
-- Without resume or overwrite, a folder that already holds metrics or checkpoints is an error,
-- so two runs never mix in one file.
-- The lock file in a run folder (remax.bind.lock: pid, host, since), and the words that start
-- the refusal when another process holds it (a caller must not remove that folder).
M.LOCK = "run.lock"
M.IN_USE = "is in use by"

function M.open(dir, opts)
  if type(dir) ~= "string" or dir == "" then error("runs.open: expected a folder path, got " .. tostring(dir), 2) end
  opts = opts or {}
  dir = dir:gsub("/+$", "")
  local config = opts.config
  local limit = opts.save_total_limit
  if limit == nil and type(config) == "table" then limit = config.save_total_limit end
  local self = setmetatable({
    dir = dir,
    name = dir:match("([^/]+)$") or dir,
    config = config,
    resume = opts.resume and true or false,
    save_total_limit = positive_int_or_nil(limit, "save_total_limit"),
    metrics_path = dir .. "/metrics.jsonl",
    completions_path = dir .. "/completions.jsonl",
    checkpoints_dir = dir .. "/" .. CHECKPOINTS,
    files = {},
  }, Run)
  mkdir_p(dir)
  -- one owner per run folder, for the whole run (issue 35): before anything in it is touched
  local lock = require("remax.bind.lock")
  self.lock_path = dir .. "/" .. M.LOCK
  local got, info = lock.take(self.lock_path)
  if not got then
    error(("%s %s %s: another remax is training in it (%s); wait for it to end or stop it, or choose another "
      .. "--run_name"):format(dir, M.IN_USE, lock.describe(info), self.lock_path), 0)
  end
  if info then
    self.lock_note = ("%s: took over the lock left by %s, which has ended"):format(dir, lock.describe(info))
  end
  self:clean_leftovers()
  local earlier = (read_text(self.metrics_path) or ""):find("%S") or #self:checkpoints() > 0
  if opts.overwrite then
    for _, f in ipairs({ self.metrics_path, self.completions_path, self.checkpoints_dir, dir .. "/index.html",
      dir .. "/metrics.csv", dir .. "/tensorboard" }) do
      remove_tree(f)
    end
    for _, name in ipairs(list_dir(dir)) do
      if name:match("%.svg$") then remove_tree(dir .. "/" .. name) end
    end
  elseif earlier and not self.resume then
    error(("runs.open: %s already holds a run (metrics or checkpoints); resume it (resume = true), "
      .. "start afresh (overwrite = true), or choose another name"):format(dir), 2)
  end
  if self.resume then
    -- Until load_checkpoint says otherwise, rows past the newest checkpoint belong to steps
    -- that will run again.
    local _, step = self:latest_checkpoint()
    self:truncate(step or 0)
    self.resume_step = step or 0
    require("remax.run.history").truncate(dir, step or 0)   -- hot reloads past the checkpoint: decided again
  end
  -- report_to: TensorBoard event files, metrics.csv (remax.run.report)
  self.reporters = require("remax.run.report").open(self, opts.report_to, { resume_step = self.resume_step })
  if config ~= nil then
    write_atomic(dir .. "/config.json", M.encode(config, { pretty = true, precision = "shortest", where = "config" }) .. "\n")
  end
  return self
end

-- Writes config.json again (a setting decided after the run opened, such as max_steps from
-- num_train_epochs).
function Run:write_config(config)
  self.config = config
  write_atomic(self.dir .. "/config.json", M.encode(config, { pretty = true, precision = "shortest", where = "config" }) .. "\n")
end

-- The run's config.json as a table (nil when absent).
function Run:read_config()
  local text = read_text(self.dir .. "/config.json")
  return text and M.decode(text, self.dir .. "/config.json") or nil
end

local function append(self, path, line)
  local f = self.files[path]
  if not f then
    local err
    f, err = io.open(path, "ab")
    if not f then error(("runs: cannot append to %s (%s)"):format(path, tostring(err)), 0) end
    self.files[path] = f
  end
  local ok, err = f:write(line, "\n")
  if ok then ok, err = f:flush() end
  if not ok then error(("runs: cannot append to %s (%s)"):format(path, tostring(err)), 0) end
end

-- Lets go of the run folder's lock (the run has ended cleanly; a process that ends otherwise
-- drops it too, and the next owner says whose it was).
function Run:release()
  if self.lock_path then require("remax.bind.lock").release(self.lock_path) end
end

-- Removes the run folder (a new run that failed before its first step ended: nothing in it is
-- worth keeping), after closing its files and letting go of its lock.
function Run:discard()
  self:close()
  remove_tree(self.dir)
end

-- Closes the append handles (they reopen on the next write) and lets go of the folder's lock
-- (another process may then open the run).
function Run:close()
  for path, f in pairs(self.files) do
    f:close()
    self.files[path] = nil
  end
  self:release()
  require("remax.run.report").close(self.reporters)
end

-- Appends {step = step, ...metrics} as one line of metrics.jsonl and flushes it.
function Run:log_metrics(step, metrics)
  check_step(step, "log_metrics")
  local row = {}
  for k, v in pairs(metrics or {}) do row[k] = v end
  row.step = step
  append(self, self.metrics_path, M.encode(row, { precision = 10, where = "metrics" }))
  require("remax.run.report").log(self.reporters, step, row)
  self.last_metrics = row
end

-- Appends each row ({prompt, completion, reward, rewards = {name = v}, advantage, greedy}) with
-- its step as a line of completions.jsonl.
function Run:log_completions(step, rows)
  check_step(step, "log_completions")
  local lines = {}
  for i, r in ipairs(rows or {}) do
    local row = {}
    for k, v in pairs(r) do row[k] = v end
    row.step = step
    lines[i] = M.encode(row, { precision = 10, where = "completions[" .. i .. "]" })
  end
  if #lines > 0 then append(self, self.completions_path, table.concat(lines, "\n")) end
end

-- metrics.jsonl as a list of rows (NaN/inf restored as numbers).
function Run:metrics()
  return (M.read_jsonl(self.metrics_path))
end

-- Keeps only rows with step <= step in metrics.jsonl and completions.jsonl (and drops lines a
-- crash tore), rewriting a file atomically only when something goes.
function Run:truncate(step)
  for _, path in ipairs({ self.metrics_path, self.completions_path }) do
    local text = read_text(path)
    if text then
      if self.files[path] then self.files[path]:close() self.files[path] = nil end
      local keep, dropped = {}, false
      for line in text:gmatch("[^\n]+") do
        local ok, v = pcall(cjson.decode, line)
        if ok and type(v) == "table" and not (type(v.step) == "number" and v.step > step) then
          keep[#keep + 1] = line
        elseif line:find("%S") then
          dropped = true
        end
      end
      if dropped or (#text > 0 and text:sub(-1) ~= "\n") then
        write_atomic(path, #keep > 0 and (table.concat(keep, "\n") .. "\n") or "")
      end
    end
  end
end

---------------------------------------------------------------------------------------------
-- Checkpoints: checkpoints/step-N/ = model:save() files + trainer_state.json +
-- trainer_state.safetensors, built in checkpoints/.tmp-step-N/ and renamed.

-- Removes temporary folders a crash left; puts back a checkpoint a crash moved aside while
-- being replaced.
function Run:clean_leftovers()
  local root = self.checkpoints_dir
  for _, name in ipairs(list_dir(root)) do
    if name:sub(1, #TMP_PREFIX) == TMP_PREFIX then
      remove_tree(root .. "/" .. name)
    elseif name:sub(1, #OLD_PREFIX) == OLD_PREFIX then
      local final = root .. "/step-" .. name:sub(#OLD_PREFIX + 1)
      if is_dir(final) then remove_tree(root .. "/" .. name) else os.rename(root .. "/" .. name, final) end
    end
  end
end

-- Complete checkpoints, oldest first: { {step = N, dir = path}, ... }.
function Run:checkpoints()
  local out = {}
  for _, name in ipairs(list_dir(self.checkpoints_dir)) do
    local n = name:match("^step%-(%d+)$")
    local dir = self.checkpoints_dir .. "/" .. name
    if n and file_exists(dir .. "/trainer_state.json") then
      out[#out + 1] = { step = tonumber(n), dir = dir }
    end
  end
  table.sort(out, function(a, b) return a.step < b.step end)
  return out
end

-- The complete checkpoints of the run folder `dir`, without opening it (a resume reads them
-- before it opens the run).
function M.checkpoints(dir)
  return Run.checkpoints({ checkpoints_dir = dir:gsub("/+$", "") .. "/" .. CHECKPOINTS })
end

-- The newest complete checkpoint: dir, step (nil when there is none).
function Run:latest_checkpoint()
  local list = self:checkpoints()
  local last = list[#list]
  if last then return last.dir, last.step end
  return nil
end

-- Saves model (Hugging Face layout, via model:save) and state: state.tensors (name -> tensor,
-- e.g. optimizer moments) go to trainer_state.safetensors bit for bit, everything else to
-- trainer_state.json (numbers with 17 digits, so they read back exactly). model may be nil.
-- Returns the checkpoint folder.
function Run:save_checkpoint(step, model, state)
  check_step(step, "save_checkpoint")
  state = state or {}
  if type(state) ~= "table" then error("runs: save_checkpoint: state is a " .. type(state) .. ", expected a table", 2) end
  -- encoded first: a state that cannot be saved fails before anything is written
  local plain = {}
  for k, v in pairs(state) do if k ~= "tensors" then plain[k] = v end end
  plain.step = step
  local json = M.encode(plain, { pretty = true, strict = true, precision = 17, where = "trainer_state" })
  local root = self.checkpoints_dir
  mkdir_p(root)
  self:clean_leftovers()
  local tmp = ("%s/%s%d"):format(root, TMP_PREFIX, step)
  local final = ("%s/step-%d"):format(root, step)
  mkdir_p(tmp)
  fs.crash_point("checkpoint: temporary folder made")
  local ok, err = pcall(function()
    if model ~= nil then
      local source = model.source_dir
      model:save(tmp)
      model.source_dir = source   -- model:save adopts a first save folder; this one is renamed away
    end
    require("remax.bind.safetensors").save(tmp .. "/trainer_state.safetensors", state.tensors or {},
      { format = "pt", step = tostring(step) })
    write_atomic(tmp .. "/trainer_state.json", json .. "\n")
    for _, name in ipairs(list_dir(tmp)) do fsync_path(tmp .. "/" .. name) end
    fsync_path(tmp)
  end)
  if not ok then
    -- a full disk or a read-only folder: the half-built folder goes (it may hold the space the
    -- next try needs); the checkpoints already there are untouched
    pcall(remove_tree, tmp)
    error(("runs: checkpoint step-%d not saved: %s"):format(step, M.without_positions(err)), 0)
  end
  local function rename(from, to)
    local ok, err, code = os.rename(from, to)
    if not ok then error(("runs: cannot rename %s to %s (%s; errno %s)"):format(from, to, tostring(err), tostring(code)), 3) end
  end
  fs.crash_point("checkpoint: before rename")
  if is_dir(final) then
    -- Replacing a checkpoint of the same step (a resumed run saving it again): move the old one
    -- aside first; clean_leftovers puts it back if a crash comes between the two renames.
    local old = ("%s/%s%d"):format(root, OLD_PREFIX, step)
    remove_tree(old)
    rename(final, old)
    fs.crash_point("checkpoint: old one moved aside")
    rename(tmp, final)
    remove_tree(old)
  else
    rename(tmp, final)
  end
  fs.crash_point("checkpoint: after rename")
  fsync_path(root)
  self:prune()
  fs.crash_point("checkpoint: pruned")
  return final
end

-- Removes the oldest checkpoints beyond save_total_limit.
function Run:prune()
  local limit = self.save_total_limit
  if not limit then return end
  local list = self:checkpoints()
  for i = 1, #list - limit do
    -- renamed out of the checkpoint names first, so a crash halfway through the removal leaves a
    -- temporary folder (removed on the next open), never a step-N folder with files missing
    local doomed = ("%s/%s%d.pruned"):format(self.checkpoints_dir, TMP_PREFIX, list[i].step)
    remove_tree(doomed)
    local ok, err, code = os.rename(list[i].dir, doomed)
    if not ok then error(("runs: cannot rename %s to %s (%s; errno %s)"):format(list[i].dir, doomed, tostring(err), tostring(code)), 2) end
    fs.crash_point("checkpoint: pruned one renamed")
    remove_tree(doomed)
  end
end

-- Reads a checkpoint (default: the latest) and makes the run's files agree with it: rows of
-- metrics.jsonl and completions.jsonl past its step are dropped.
-- Returns state (trainer_state.json), tensors (name -> new tensor), and the folder holding the
-- model in Hugging Face layout (for remax.model.load).
function Run:load_checkpoint(dir)
  if dir == nil then
    dir = self:latest_checkpoint()
    if not dir then error(("runs: load_checkpoint: %s has no checkpoint"):format(self.checkpoints_dir), 2) end
  end
  local path = dir .. "/trainer_state.json"
  local text = read_text(path)
  if not text then error(("runs: load_checkpoint: cannot read %s (not a checkpoint folder?)"):format(path), 2) end
  local state = M.decode(text, path)
  if type(state) ~= "table" or (#state > 0) then error(("runs: load_checkpoint: %s is not a JSON object"):format(path), 2) end
  local folder_step = tonumber(dir:match("step%-(%d+)/*$"))
  local step = state.step or folder_step
  if type(step) ~= "number" then error(("runs: load_checkpoint: %s has no step"):format(path), 2) end
  -- issue 35: a state that says another step than its folder was edited or copied from elsewhere
  if folder_step and step ~= folder_step then
    error(("runs: load_checkpoint: %s says step %s but its folder is step-%d (edited, or copied from another "
      .. "checkpoint?); resume from a checkpoint whose trainer_state.json matches its folder"):format(path, tostring(step), folder_step), 0)
  end
  local tensors = {}
  local st_path = dir .. "/trainer_state.safetensors"
  if not file_exists(st_path) then   -- every checkpoint has one (the optimizer's moments)
    error(("runs: load_checkpoint: %s is missing (the optimizer state of step %s): the checkpoint is incomplete; "
      .. "resume from an earlier checkpoint (move %s aside)"):format(st_path, tostring(step), dir), 0)
  end
  do
    local st = require("remax.bind.safetensors").open(st_path)
    for _, name in ipairs(st:names()) do tensors[name] = st:read(name) end
    st:close()
  end
  self:truncate(step)
  return state, tensors, dir
end

---------------------------------------------------------------------------------------------
-- Plots: one SVG per chart whose metric keys appear in metrics.jsonl, and index.html.

-- The metric keys the trainer writes and the charts they feed (the contract; docs/runs.md).
M.charts = {
  { file = "reward.svg", title = "Reward", ylabel = "reward",
    series = { { key = "reward", name = "sampled" }, { key = "reward_greedy", name = "greedy" } } },
  -- no KL chart when every KL is 0 (beta = 0: no reference model, nothing to draw but a flat line)
  { file = "kl.svg", title = "KL to the reference model", ylabel = "KL", series = { { key = "kl", name = "kl" } },
    skip_when_zero = true },
  { file = "lr.svg", title = "Learning rate", ylabel = "learning rate", series = { { key = "lr", name = "lr" } } },
  { file = "length.svg", title = "Completion length", ylabel = "tokens",
    series = { { key = "completion_length_mean", name = "mean length" }, { key = "completion_length_max", name = "max" },
      { key = "completion_length_min", name = "min" } } },
  { file = "eval.svg", title = "Eval accuracy", ylabel = "accuracy",
    series = { { key = "eval_accuracy", name = "eval accuracy" } } },
  { file = "loss.svg", title = "Loss", ylabel = "loss", series = { { key = "loss", name = "loss" } } },
  -- algo = reward: the pairs ranked right and by how much (r_chosen - r_rejected)
  { file = "pairs.svg", title = "Preference pairs (reward model)", ylabel = "pair accuracy, margin",
    series = { { key = "accuracy", name = "train pair accuracy" }, { key = "margin", name = "train margin" },
      { key = "eval_margin", name = "held-out margin" } } },
  { file = "entropy.svg", title = "Entropy of the policy", ylabel = "nats per token",
    series = { { key = "entropy", name = "entropy" } } },
  { file = "signal.svg", title = "Learning signal", ylabel = "fraction",
    series = { { key = "frac_rows_nonzero_adv", name = "rows with advantage != 0" },
      { key = "frac_prompts_nonzero_adv", name = "prompts with any" },
      { key = "frac_reward_zero_std", name = "groups with zero reward spread" },
      { key = "truncated_fraction", name = "truncated completions" } } },
  { file = "clip.svg", title = "Clipped importance ratios", ylabel = "fraction of tokens",
    series = { { key = "clip_ratio/low_mean", name = "low" }, { key = "clip_ratio/high_mean", name = "high" },
      { key = "clip_ratio/region_mean", name = "region" } } },
  -- every reward function's mean over the sampled completions (reward/<name>), on one chart: a
  -- learned reward beside a weight-0 measured truth shows over-optimisation (recipes/rlhf/)
  { file = "rewards.svg", title = "Reward per function (sampled mean)", ylabel = "reward",
    series_of = function(rows) return require("remax.run.plot").reward_keys(rows) end, min_series = 2 },
}

local function html_escape(s)
  return (tostring(s):gsub("[&<>\"']", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;",
    ['"'] = "&quot;", ["'"] = "&#39;" }))
end
M.html_escape = html_escape

local function format_value(v)
  if type(v) == "number" then
    if v ~= v then return "NaN" end
    if v == math.floor(v) and math.abs(v) < 1e15 then return ("%d"):format(v) end
    return ("%.6g"):format(v)
  end
  if type(v) == "table" then return M.encode(v, { precision = 6 }) end
  return tostring(v)
end

-- Writes the SVG charts and index.html from metrics.jsonl and config.json; returns the list of
-- files written (names relative to the run folder).
function Run:plot()
  local plot = require("remax.run.plot")
  local rows = self:metrics()
  local written, charts = {}, {}
  for _, chart in ipairs(M.charts) do
    local series, present = {}, false
    for _, s in ipairs(chart.series_of and chart.series_of(rows) or chart.series) do
      local xs, ys, seen = {}, {}, false
      for _, row in ipairs(rows) do
        local v = row[s.key]
        if v ~= nil then seen = true end
        if type(v) == "number" and type(row.step) == "number" then
          xs[#xs + 1], ys[#ys + 1] = row.step, v
        end
      end
      if seen then
        present = true
        series[#series + 1] = { name = s.name, x = xs, y = ys }
      end
    end
    if present and chart.min_series and #series < chart.min_series then present = false end
    if present and chart.skip_when_zero then
      present = false
      for _, se in ipairs(series) do
        for _, y in ipairs(se.y) do if y ~= 0 then present = true end end
      end
    end
    if present then
      write_atomic(self.dir .. "/" .. chart.file,
        plot.svg_lines(series, { title = chart.title, xlabel = "step", ylabel = chart.ylabel, integer_x = true,
          width = 960, height = 320 }))
      written[#written + 1] = chart.file
      charts[#charts + 1] = chart
    end
  end
  local last = rows[#rows]
  local h = {}
  local function add(s) h[#h + 1] = s end
  add("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">")
  add("<title>" .. html_escape(self.name) .. " - remax run</title>")
  add("<style>body{font-family:sans-serif;margin:1.5em;color:#222}img{display:block;width:100%;max-width:1400px;height:auto;margin:8px 0}"
    .. "table{border-collapse:collapse}td{padding:2px 10px;border-bottom:1px solid #ddd}"
    .. "td:first-child{color:#555}pre{background:#f6f6f6;padding:1em;overflow:auto}</style>")
  add("</head><body>")
  add("<h1>" .. html_escape(self.name) .. "</h1>")
  -- steps, not rows: the evaluation before training is logged at step 0, the final one beside the last step
  local steps, seen_step = 0, {}
  for _, row in ipairs(rows) do
    if type(row.step) == "number" and row.step > 0 and not seen_step[row.step] then seen_step[row.step], steps = true, steps + 1 end
  end
  add(("<p>%d training step%s logged. Files: metrics.jsonl, completions.jsonl, config.json, checkpoints/.</p>")
    :format(steps, steps == 1 and "" or "s"))
  if #charts == 0 then add("<p>No metrics yet.</p>") end
  for _, chart in ipairs(charts) do
    add(("<img src=\"%s\" alt=\"%s\">"):format(html_escape(chart.file), html_escape(chart.title)))
  end
  if last then
    add("<h2>Last step</h2><table>")
    local keys = {}
    for k in pairs(last) do keys[#keys + 1] = tostring(k) end
    table.sort(keys, function(a, b)
      if (a == "step") ~= (b == "step") then return a == "step" end
      return a < b
    end)
    for _, k in ipairs(keys) do
      add(("<tr><td>%s</td><td>%s</td></tr>"):format(html_escape(k), html_escape(format_value(last[k]))))
    end
    add("</table>")
  end
  add(require("remax.run.report").episodes_html(self.completions_path, html_escape))   -- multi-turn runs: a few episodes
  local config_text = read_text(self.dir .. "/config.json")
  if config_text then
    add("<h2>Config</h2><pre>" .. html_escape(config_text) .. "</pre>")
  end
  add("</body></html>\n")
  write_atomic(self.dir .. "/index.html", table.concat(h, "\n"))
  written[#written + 1] = "index.html"
  return written
end

return M
