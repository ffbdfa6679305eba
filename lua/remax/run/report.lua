-- remax.run.report: where a run's metrics go besides metrics.jsonl (which is always written):
-- report_to as TRL spells it. "tensorboard" writes event files (remax.run.tensorboard) under
-- runs/<name>/tensorboard/, "csv" writes runs/<name>/metrics.csv, "none" nothing more, "all" both.
-- Services (wandb, mlflow, ...) are refused: the engine has no network dependency. Both name
-- the metrics as TRL does (train/reward, train/rewards/<name>/mean, ...: remax.run.trl_names).
--
--   local reporters = report.open(run, { "tensorboard", "csv" }, { resume_step = 40 })
--   report.log(reporters, step, row);  report.close(reporters)
local M = {}

-- What report_to may name, and the refusal of anything else, are settings
-- (remax.settings.schema.report_to_refusal); config.resolve checks them before a run opens.
local schema = require("remax.settings.schema")

-- The reporters a list asks for: { tensorboard = bool, csv = bool }.
function M.wanted(list)
  local want = {}
  for _, name in ipairs(list or {}) do
    if name == "all" then want.tensorboard, want.csv = true, true
    elseif name ~= "none" then want[name] = true end
  end
  return want
end

---------------------------------------------------------------------------------------------
-- metrics.csv: a header of every metric seen so far (step first, then sorted) and one row per
-- metrics.jsonl row. A metric that first appears later widens the header: the file is then
-- written again from metrics.jsonl (rare: new metrics come in the first steps, or at the
-- final evaluation). On resume it is written again from metrics.jsonl too, so it always says
-- what metrics.jsonl says.

local Csv = {}
Csv.__index = Csv

local function cell(v)
  if v == nil then return "" end
  if type(v) == "number" then
    if v ~= v then return "nan" end
    if v == math.huge then return "inf" end
    if v == -math.huge then return "-inf" end
    if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return ("%d"):format(v) end
    return ("%.10g"):format(v)
  end
  if type(v) == "boolean" then return tostring(v) end
  if type(v) ~= "string" then return "" end
  if v:find('[,"\r\n]') then return '"' .. v:gsub('"', '""') .. '"' end
  return v
end

local trl_names = require("remax.run.trl_names")

local function flat(row)   -- only scalar values go into the table, under TRL's names
  local out = {}
  for k, v in pairs(row) do
    if type(k) == "string" and (type(v) == "number" or type(v) == "string" or type(v) == "boolean") then
      out[trl_names.tag(k)] = v
    end
  end
  return out
end

function Csv:line(row)
  local cells = {}
  for i, k in ipairs(self.columns) do cells[i] = cell(row[k]) end
  return table.concat(cells, ",") .. "\n"
end

function Csv:rewrite()
  local fs = require("remax.bind.fs")
  local parts = { table.concat(self.columns, ",") .. "\n" }
  for _, row in ipairs(self.rows) do parts[#parts + 1] = self:line(row) end
  if self.f then self.f:close(); self.f = nil end
  fs.write_atomic(self.path, table.concat(parts))
end

-- Adds the row's new keys to the columns; true when there were any.
function Csv:widen(row)
  local new = false
  for k in pairs(row) do
    if not self.known[k] then self.known[k], new = true, true end
  end
  if new then
    local cols = {}
    for k in pairs(self.known) do if k ~= "step" then cols[#cols + 1] = k end end
    table.sort(cols)
    table.insert(cols, 1, "step")
    self.columns = cols
  end
  return new
end

function Csv:log(step, row)
  row = flat(row)
  row.step = step
  self.rows[#self.rows + 1] = row
  if self:widen(row) then return self:rewrite() end
  if not self.f then
    local err
    self.f, err = io.open(self.path, "ab")
    if not self.f then error(("report_to csv: cannot append to %s (%s)"):format(self.path, tostring(err)), 0) end
  end
  local ok, err = self.f:write(self:line(row))
  if ok then ok, err = self.f:flush() end
  if not ok then error(("report_to csv: cannot write %s (%s)"):format(self.path, tostring(err)), 0) end
end

function Csv:close()
  if self.f then self.f:close(); self.f = nil end
end

local function open_csv(run)
  local c = setmetatable({ path = run.dir .. "/metrics.csv", rows = {}, known = { step = true }, columns = { "step" } }, Csv)
  for _, row in ipairs(run:metrics()) do
    row = flat(row)
    c.rows[#c.rows + 1] = row
    c:widen(row)
  end
  c:rewrite()
  return c
end

---------------------------------------------------------------------------------------------

local Tb = {}
Tb.__index = Tb
function Tb:log(step, row) self.w:scalars(step, trl_names.row(row)) end
function Tb:close() self.w:close() end

-- The reporters of a run (remax.run.folder) for a report_to list. opts.resume_step: the step a
-- resumed run continues after.
function M.open(run, list, opts)
  opts = opts or {}
  for _, name in ipairs(list or {}) do
    local why = schema.report_to_refusal(name)
    if why then error(why, 0) end
  end
  local want, out = M.wanted(list), {}
  if want.tensorboard then
    local w = require("remax.run.tensorboard").open(run.dir .. "/tensorboard",
      { start_step = (opts.resume_step or 0) + 1 })
    out[#out + 1] = setmetatable({ w = w, name = "tensorboard" }, Tb)
  end
  if want.csv then out[#out + 1] = open_csv(run) end
  return out
end

function M.log(reporters, step, row)
  for _, r in ipairs(reporters or {}) do r:log(step, row) end
end

function M.close(reporters)
  for _, r in ipairs(reporters or {}) do r:close() end
end

---------------------------------------------------------------------------------------------
-- Episodes in the HTML report (index.html, remax.run.folder's Run:plot): a few multi-turn
-- episodes of the last step that has any, from completions.jsonl's episode records (turns,
-- tool calls and their results, observations, the reward). Self-contained: episodes_html(path,
-- escape, opts) -> the HTML section, or "" when the file holds no episode.

M.EPISODES_SHOWN = 4      -- episodes in the report
M.EPISODE_TEXT_MAX = 2000 -- characters of one message shown (the rest is cut, marked)

-- The episode records of the last step that has any (lines without "episode" are not decoded).
function M.last_episodes(path)
  local f = io.open(path, "rb")
  if not f then return {}, nil end
  local json = require("remax.formats.json")
  local step, list = nil, {}
  for line in f:lines() do
    if line:find('"episode":{', 1, true) then
      local ok, rec = pcall(json.decode, line, path)
      if ok and type(rec) == "table" and type(rec.episode) == "table" then
        if rec.step ~= step then step, list = rec.step, {} end
        list[#list + 1] = rec
      end
    end
  end
  f:close()
  return list, step
end

-- Which episodes to show: the greedy one, then the best and the worst by reward, then the rest in order.
function M.pick_episodes(list, n)
  n = n or M.EPISODES_SHOWN
  local order, taken = {}, {}
  local function take(i) if i and not taken[i] and #order < n then taken[i] = true; order[#order + 1] = list[i] end end
  for i, r in ipairs(list) do if r.greedy then take(i) break end end
  local best, worst
  for i, r in ipairs(list) do
    if type(r.reward) == "number" and r.reward == r.reward then
      if not best or r.reward > list[best].reward then best = i end
      if not worst or r.reward < list[worst].reward then worst = i end
    end
  end
  take(best); take(worst)
  for i = 1, #list do take(i) end
  return order
end

local function number_text(v)
  if type(v) ~= "number" then return "-" end
  if v ~= v then return "NaN" end
  if v == math.floor(v) and math.abs(v) < 1e15 then return ("%d"):format(v) end
  return ("%.4g"):format(v)
end

function M.episodes_html(path, escape, opts)
  opts = opts or {}
  local list, step = M.last_episodes(path)
  if #list == 0 then return "" end
  local max = opts.text_max or M.EPISODE_TEXT_MAX
  local function text(s)
    s = type(s) == "string" and s or require("remax.formats.json").encode(s)
    if #s > max then return escape(s:sub(1, max)) .. ("<i>... (%d more bytes)</i>"):format(#s - max) end
    return escape(s)
  end
  local h = {}
  local function add(x) h[#h + 1] = x end
  add(("<h2>Episodes (step %s)</h2>"):format(escape(number_text(step))))
  add("<style>.ep{border:1px solid #ccc;margin:1em 0;padding:.5em 1em}.msg{white-space:pre-wrap;margin:4px 0;padding:4px 8px;"
    .. "font-family:monospace;border-left:4px solid #bbb}.assistant{border-color:#4a7;background:#f3faf5}.tool{border-color:#a74;"
    .. "background:#fbf6f1}.user{border-color:#47a;background:#f2f5fb}.role{color:#666;font-size:85%}</style>")
  for _, r in ipairs(M.pick_episodes(list, opts.shown)) do
    local e = r.episode
    local errs = {}
    for kind, n in pairs(type(e.errors) == "table" and e.errors or {}) do errs[#errs + 1] = ("%s %s"):format(kind, number_text(n)) end
    table.sort(errs)
    add("<div class=\"ep\">")
    add(("<p><b>%s</b> reward %s, advantage %s; %s turn%s, %s tool call%s, %s tool error%s%s, %s model / %s observation tokens%s%s</p>"):format(
      r.greedy and "greedy episode" or "episode", escape(number_text(r.reward)), escape(number_text(r.advantage)),
      escape(number_text(e.turns)), e.turns == 1 and "" or "s", escape(number_text(e.tool_calls)), e.tool_calls == 1 and "" or "s",
      escape(number_text(e.tool_errors)), e.tool_errors == 1 and "" or "s", #errs > 0 and (" (" .. escape(table.concat(errs, ", ")) .. ")") or "",
      escape(number_text(e.model_tokens)), escape(number_text(e.obs_tokens)),
      e.env_reward ~= nil and (", environment reward " .. escape(number_text(e.env_reward))) or "",
      e.truncated and ", truncated" or ""))
    if e.env_error then add(("<p>environment error: %s</p>"):format(text(e.env_error))) end
    if type(e.turn_rewards) == "table" and #e.turn_rewards > 0 then
      local t = {}
      for i, v in ipairs(e.turn_rewards) do t[i] = number_text(v) end
      add(("<p>per-turn rewards: %s</p>"):format(escape(table.concat(t, ", "))))
    end
    local prompt = r.prompt
    if type(prompt) == "table" then
      for _, m in ipairs(prompt) do
        add(("<div class=\"msg user\"><span class=\"role\">%s (prompt)</span>\n%s</div>"):format(escape(tostring(m.role)), text(m.content or "")))
      end
    elseif prompt ~= nil then
      add(("<div class=\"msg user\"><span class=\"role\">prompt</span>\n%s</div>"):format(text(prompt)))
    end
    for _, m in ipairs(type(r.messages) == "table" and r.messages or {}) do
      local role = tostring(m.role)
      local cls = (role == "assistant" or role == "tool") and role or "user"
      local label = role == "tool" and ("tool result" .. (m.name and (" (" .. tostring(m.name) .. ")") or "")) or role
      add(("<div class=\"msg %s\"><span class=\"role\">%s</span>\n%s</div>"):format(cls, escape(label), text(m.content or "")))
    end
    add("</div>")
  end
  add(("<p>%d episode%s in this step; completions.jsonl has them all.</p>"):format(#list, #list == 1 and "" or "s"))
  return table.concat(h, "\n")
end

return M
