-- remax.step.rewards: loading reward functions (rewards/*.lua files, recipe tables or functions),
-- scoring completions with all of them, combining with weights, and stopping with a clear
-- message when one fails.
--
--   local list = rewards.load_all({"gsm8k", my_table, my_function}, {base = "recipes"})
--   local scores, total = rewards.score(list, weights, completions, batch, {step = 3})
--   local length = rewards.file("length").with({target = 200})      -- configure a built-in
--
-- A reward is {name=, fn=function(completions, batch) -> {number|nil, ...}}; nil = no score.
-- A reward model is "model:path/to/rm" or {model = path, weight =, batch_size =, name =}
-- (remax.step.model_reward). A reward's own weight applies when reward_weights is not given.
local M = {}

local function file_exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

local function dirname(path) return path:match("^(.*)/[^/]*$") or "." end

-- Folders searched for a reward given by name: next to the recipe (../rewards, ./rewards), the
-- current folder's rewards/, and the remax installation's rewards/.
function M.search_dirs(base)
  local dirs = {}
  if base then
    dirs[#dirs + 1] = base .. "/../rewards"
    dirs[#dirs + 1] = base .. "/rewards"
  end
  dirs[#dirs + 1] = "rewards"
  local home = os.getenv("REMAX_HOME")
  if home then dirs[#dirs + 1] = home .. "/rewards" end
  return dirs
end

-- "gsm8k" -> "rewards/gsm8k.lua"; a path ending in .lua is used as is.
-- For reward files with options: make(opts) -> { name =, fn = }. The reward gets
-- .with(more), which makes it again with `more` merged over its current options:
--   return require("remax.step.rewards").configurable(make)          -- at the end of rewards/x.lua
--   rewards = { require("remax.step.rewards").file("x").with({ target = 200 }) }   -- in a recipe
function M.configurable(make, opts)
  opts = opts or {}
  local r = make(opts)
  function r.with(more)
    local o = {}
    for k, v in pairs(opts) do o[k] = v end
    for k, v in pairs(more or {}) do o[k] = v end
    local ok, remade = pcall(M.configurable, make, o)
    if not ok then error(remade, 2) end   -- a bad option: point at the caller of .with
    return remade
  end
  return r
end

function M.find(name, base)
  if name:match("%.lua$") or name:find("/", 1, true) then
    if not file_exists(name) then error(("reward file %s does not exist"):format(name), 0) end
    return name
  end
  local tried = {}
  for _, d in ipairs(M.search_dirs(base)) do
    local p = d .. "/" .. name .. ".lua"
    if file_exists(p) then return (p:gsub("^%./", "")) end
    tried[#tried + 1] = p
  end
  local available = {}
  for _, d in ipairs(M.search_dirs(base)) do
    local pipe = io.popen("ls '" .. d:gsub("'", "'\\''") .. "' 2>/dev/null")
    if pipe then
      for f in pipe:lines() do
        local n = f:match("^(.-)%.lua$")
        if n then available[n] = true end
      end
      pipe:close()
    end
  end
  local names = {}
  for n in pairs(available) do names[#names + 1] = n end
  table.sort(names)
  error(("unknown reward '%s' (looked for %s; available: %s)"):format(name, table.concat(tried, ", "),
    #names > 0 and table.concat(names, ", ") or "none"), 0)
end

-- "file:line" where a function is defined.
function M.where(fn)
  local info = debug.getinfo(fn, "S")
  local src = info.source:sub(1, 1) == "@" and info.source:sub(2) or info.short_src
  return ("%s:%d"):format(src, info.linedefined), src
end

-- Turn a spec (table {name=, fn=}, function, or name/path) into {name=, fn=, where=, file=}.
-- file: the source file of fn (for hot reload); path: the file it was loaded from by name.
function M.normalize(spec, index, opts)
  opts = opts or {}
  local r
  local reward_model = require("remax.step.model_reward")
  local reward_worker = require("remax.step.reward_worker")
  if reward_model.is_spec(spec) then
    return reward_model.reward(spec, { dtype = opts.dtype, device = opts.device, padding_free = opts.padding_free })
  elseif reward_worker.is_spec(spec) then   -- "py:", "cmd:", "http://": outside Lua
    return reward_worker.reward(spec, { base = opts.base, max_line_bytes = opts.max_line_bytes })
  elseif type(spec) == "string" then
    return M.load_file(M.find(spec, opts.base))
  elseif type(spec) == "function" then
    r = { fn = spec }
  elseif type(spec) == "table" and type(spec.fn) == "function" then
    r = {}
    for k, v in pairs(spec) do r[k] = v end
  else
    error(("reward %d is a %s; expected a name, a file, a table {name=, fn=} or a function"):format(
      index or 0, type(spec)), 0)
  end
  r.where, r.file = M.where(r.fn)
  if r.name == nil then
    local base = r.file:match("([^/]+)%.lua$")
    r.name = (opts.default_name) or (type(spec) == "function" and base and index and (base .. "_" .. index)) or
      ("reward_" .. tostring(index))
  end
  if type(r.name) ~= "string" then error(("reward at %s: name must be a string"):format(r.where), 0) end
  return r
end

-- Load a reward file: it returns {name=, fn=} or a function.
function M.load_file(path)
  local chunk, err = loadfile(path)
  if not chunk then error(("reward file %s"):format(err), 0) end
  local ok, value = pcall(chunk)
  if not ok then error(("reward file %s failed to load: %s"):format(path, tostring(value)), 0) end
  if type(value) ~= "function" and not (type(value) == "table" and type(value.fn) == "function") then
    error(("reward file %s returned a %s; expected {name=, fn=function(completions, batch)} or a function"):format(
      path, type(value)), 0)
  end
  local r = M.normalize(value, nil, { default_name = path:match("([^/]+)%.lua$") })
  r.path = path
  return r
end

-- A reward file by name, for recipes: rewards.file("length").with({target = 200}).
function M.file(name, base)
  local path = M.find(name, base)
  local chunk, err = loadfile(path)
  if not chunk then error(err, 2) end
  return chunk()
end

function M.load_all(specs, opts)
  local list, seen = {}, {}
  for i, spec in ipairs(specs) do
    local r = M.normalize(spec, i, opts)
    if seen[r.name] then
      error(("two reward functions are named '%s' (%s and %s); give one another name"):format(r.name,
        seen[r.name], r.where), 0)
    end
    seen[r.name] = r.where
    list[i] = r
  end
  return list
end

---------------------------------------------------------------------------- scoring

local function quote(s)
  s = tostring(s)
  if #s > 400 then s = s:sub(1, 400) .. "..." end
  return ("%q"):format(s):gsub("\\\n", "\\n")
end

local function slice(batch, i)
  local out = {}
  for k, col in pairs(batch) do
    if type(col) == "table" then out[k] = { col[i] } end
  end
  return out
end

local function step_text(opts)
  return opts and opts.step and (" at step " .. opts.step) or ""
end

---------------------------------------------------------------------------- reward_timeout

-- Monotonic seconds.
M.clock = require("remax.bind.clock").now

local guard = require("remax.step.guard")
local TIMEOUT = guard.TIMEOUT
M.TIMEOUT = TIMEOUT

-- pcall(fn, ...) stopped after `limit` seconds of wall time (nil or 0: no limit): remax.step.guard's
-- call, the one limit on every Lua callback of a recipe (a hook on a clock, the JIT off, pcall
-- that passes the stop on, os.exit trapped, Ctrl-C and SIGTERM honoured). Returns what pcall
-- returns (the first result), or false, M.TIMEOUT, seconds.
function M.call_with_timeout(limit, fn, ...)
  local ok, a, b = guard.call(fn, { limit = limit }, ...)
  if ok then return true, a end
  return false, a, b
end

-- A reward's call: the same, naming the reward (os.exit's and an interruption's messages).
local function call_reward(r, limit, ...)
  local ok, a, b = guard.call(r.fn, { limit = limit, what = ("the reward '%s'"):format(r.name) }, ...)
  if ok then return true, a end
  return false, a, b
end

-- The limit of one reward call on one batch: reward_timeout when it is set (0: none), else
-- DEFAULT_TIMEOUT seconds, or PER_GENERATE times the time generating the batch took when that
-- is longer. A reward in plain Lua (matching, parsing) scores a batch in well under a second,
-- so a minute only catches one that is stuck; a reward model reads the same tokens as the
-- generation did, but in one pass, so four times the generation time leaves it room on any
-- model and machine. A reward stuck in a loop is named after a minute, not ten.
M.DEFAULT_TIMEOUT, M.PER_GENERATE = 60, 4
function M.limit(setting, generate_seconds)
  if setting ~= nil then return setting end
  return math.max(M.DEFAULT_TIMEOUT, M.PER_GENERATE * (generate_seconds or 0))
end

-- Whether scoring a step was slow enough to say so in the progress line: a quarter of its
-- limit, or over a second and longer than generating the completions took.
function M.is_slow(score_seconds, generate_seconds, limit)
  if not score_seconds then return false end
  if limit and limit > 0 and score_seconds > limit / 4 then return true end
  return score_seconds > 1 and score_seconds > (generate_seconds or 0)
end

-- Raise the error message for a reward failure; opts.on_failure() runs first (a checkpoint).
local function fail(r, msg, opts)
  if opts and opts.on_failure then opts.on_failure(msg) end
  error(msg, 0)
end

-- Run one reward on all completions, checking what it returns. Returns the scores list.
function M.run_one(r, completions, batch, opts)
  local limit = opts and opts.timeout
  -- a reward model scores packed rows unless the run pads (padding_free = false)
  if r.reward_model and opts and opts.padding_free ~= nil then r.reward_model.padding_free = opts.padding_free end
  local n = #completions
  local ok, scores, seconds
  if r.external then   -- a worker or server keeps its own deadline; its errors are whole messages
    -- (no limit given, as in a hot reload's trial: the default reward_timeout, so a hung worker cannot hang the run)
    ok, scores = pcall(r.fn, completions, batch, { timeout = limit or M.limit(nil), step = opts and opts.step,
      state = opts and opts.state })
    if not ok and guard.is_interrupt(scores) then error(scores, 0) end   -- Ctrl-C while it computed: the Run's stop
    if not ok then fail(r, ("reward '%s' (%s)%s: %s"):format(r.name, r.where, step_text(opts), tostring(scores)), opts) end
  else
    ok, scores, seconds = call_reward(r, limit, completions, batch)
  end
  if not ok and scores == TIMEOUT then
    fail(r, ("reward '%s' (%s) took over reward_timeout = %g s%s (stopped at %.1f s, scoring %d completions); " ..
      "make it faster, or raise reward_timeout (0: no limit)"):format(r.name, r.where, limit, step_text(opts), seconds, n), opts)
  end
  if not ok then
    -- find the first completion that makes it throw, to show it
    local bad_i, bad_err
    for i = 1, n do
      local ok1, e = call_reward(r, limit, { completions[i] }, slice(batch, i))
      if not ok1 then
        if e ~= TIMEOUT then bad_i, bad_err = i, e end
        break
      end
    end
    local err = bad_err or scores
    fail(r, ("reward '%s' (%s) failed%s%s: %s%s"):format(r.name, r.where, step_text(opts),
      bad_i and (" on completion " .. bad_i) or "", tostring(err),
      bad_i and ("\n  completion: " .. quote(completions[bad_i])) or ""), opts)
  end
  if type(scores) ~= "table" then
    fail(r, ("reward '%s' (%s) returned a %s%s; expected a list of %d numbers (nil = no score)"):format(
      r.name, r.where, type(scores), step_text(opts), n), opts)
  end
  for i = 1, n do
    local v = scores[i]
    if v ~= nil and (type(v) ~= "number" or v ~= v or v == math.huge or v == -math.huge) then
      fail(r, ("reward '%s' (%s) returned %s for completion %d%s; expected a finite number or nil\n  completion: %s")
        :format(r.name, r.where, type(v) == "number" and tostring(v) or ("a " .. type(v) .. " (" .. tostring(v) .. ")"),
          i, step_text(opts), quote(completions[i])), opts)
    end
  end
  for k in pairs(scores) do
    if type(k) ~= "number" or k > n or k < 1 then
      fail(r, ("reward '%s' (%s) returned %s scores for %d completions%s"):format(r.name, r.where,
        tostring(#scores), n, step_text(opts)), opts)
    end
  end
  return scores
end

-- Hands the batch to every reward that runs outside Lua (a worker, a server), without waiting;
-- score (or run_one) collects the answers later. A batch already sent is not sent again.
function M.send(list, completions, batch, opts)
  for _, r in ipairs(list) do
    if r.send then r.send(completions, batch, { timeout = opts and opts.timeout, step = opts and opts.step, state = opts and opts.state }) end
  end
end

-- Score with every reward. Returns per[name] = scores, total[i] = sum_k w_k * s_k[i] over the
-- rewards that gave a score (0 when none did), how many rows had no score at all, and
-- none[i] = true for those rows.
function M.score(list, weights, completions, batch, opts)
  local per, total, unscored = {}, {}, 0
  for i = 1, #completions do total[i] = 0 end
  local any = {}
  -- workers and reward servers get the batch first and score while the Lua rewards run
  M.send(list, completions, batch, opts)
  for k, r in ipairs(list) do
    local scores = M.run_one(r, completions, batch, opts)
    per[r.name] = scores
    local w = weights and weights[k] or r.weight or 1
    for i = 1, #completions do
      if scores[i] ~= nil then
        total[i] = total[i] + w * scores[i]
        any[i] = true
      end
    end
  end
  local none = {}
  for i = 1, #completions do
    if not any[i] then unscored, none[i] = unscored + 1, true end
  end
  return per, total, unscored, none
end

-- The run's state as TRL hands it to reward functions (transformers' TrainerState names):
-- global_step (the step being scored; 0 before the first), max_steps, epoch (a float: steps
-- done times prompts per step over the dataset's rows), num_train_epochs, logging_steps,
-- save_steps, eval_steps, train_batch_size (prompts per step and rank) and whether this is rank
-- 0. info: rows (of the training data), prompts_per_step (global), rank, local_rank,
-- train_batch_size.
function M.trainer_state(cfg, step, info)
  cfg, info, step = cfg or {}, info or {}, step or 0
  local rows, per_step = info.rows or 0, info.prompts_per_step or 0
  local known = rows > 0 and per_step > 0
  local rank = info.rank or 0
  return { global_step = step, max_steps = cfg.max_steps, epoch = known and (step * per_step / rows) or 0,
    num_train_epochs = cfg.num_train_epochs or ((known and cfg.max_steps) and math.ceil(cfg.max_steps * per_step / rows)) or nil,
    logging_steps = cfg.logging_steps, save_steps = cfg.save_steps, eval_steps = cfg.eval_steps,
    train_batch_size = info.train_batch_size, is_world_process_zero = rank == 0,
    is_local_process_zero = (info.local_rank or rank) == 0 }
end

-- What trainer_state needs of a run beside its settings: the training rows (of train_ds),
-- prompts per step (global) and per rank, the rank (world: remax.bind.dist's).
function M.state_info(cfg, train_ds, world)
  local per_rank = (cfg.per_device_train_batch_size or 1) * (cfg.gradient_accumulation_steps or 1)
  return { rows = train_ds and train_ds.rows and #train_ds.rows or 0, prompts_per_step = per_rank * ((world and world.size) or 1),
    train_batch_size = per_rank, rank = world and world.rank or 0, local_rank = world and world.local_rank }
end

-- The completions and batch a training step gives the rewards for `rows` (dataset rows) and
-- their stand-in completions: every column, prompt_ids, completion_ids, greedy, finish, and
-- completion_messages for conversational prompts -- the same names as Rollout:reward_inputs.
-- opts.encode_prompt(prompt) / opts.encode(text): token ids (empty lists without them).
function M.step_inputs(rows, completions, collate, opts)
  opts = opts or {}
  local batch = collate(rows)
  batch.prompt_ids, batch.completion_ids, batch.greedy, batch.finish = {}, {}, {}, {}
  for i = 1, #rows do
    local okp, pids = pcall(function() return opts.encode_prompt and opts.encode_prompt(rows[i].prompt) end)
    local okc, cids = pcall(function() return opts.encode and opts.encode(completions[i]) end)
    batch.prompt_ids[i] = okp and type(pids) == "table" and pids or {}
    batch.completion_ids[i] = okc and type(cids) == "table" and cids or {}
    batch.greedy[i], batch.finish[i] = false, "stop"
    if type(rows[i].prompt) == "table" then
      batch.completion_messages = batch.completion_messages or {}
      batch.completion_messages[i] = { { role = "assistant", content = completions[i] } }
    end
  end
  return completions, batch
end

-- Check that each reward runs on the first rows of a dataset (catches missing columns before
-- any generation), given what a training step gives it (step_inputs; opts: its encoders, and
-- opts.state, the trainer_state of py: rewards). completion: a stand-in text (the row's answer
-- when it has one).
function M.probe(list, rows, source, collate, timeout, opts)
  local n = math.min(#rows, 2)
  if n == 0 then return end
  local sample = {}
  for i = 1, n do sample[i] = rows[i] end
  local completions = {}
  for i = 1, n do
    local a = rows[i].answer
    completions[i] = type(a) == "string" and a or "0"
  end
  local batch
  completions, batch = M.step_inputs(sample, completions, collate, opts)
  local cols = {}
  for k in pairs(rows[1]) do cols[#cols + 1] = k end
  table.sort(cols)
  for _, r in ipairs(list) do
    local ok, err, seconds
    if r.external then
      -- probe: a Python reward that reads `environments` (none exist before the first episode) is not checked further
      ok, err = pcall(r.fn, completions, batch, { timeout = timeout, step = 0, state = opts and opts.state, probe = true })
    else
      ok, err, seconds = call_reward(r, timeout, completions, batch)
    end
    if not ok and err == TIMEOUT then
      error(("reward '%s' (%s) took over reward_timeout = %g s on the first %d rows of %s (stopped at %.1f s)")
        :format(r.name, r.where, timeout, n, source, seconds), 0)
    end
    if not ok then
      error(("reward '%s' (%s) fails on the first rows of %s (columns: %s): %s"):format(r.name, r.where,
        source, table.concat(cols, ", "), tostring(err)), 0)
    end
  end
end

M.dirname = dirname
return M
