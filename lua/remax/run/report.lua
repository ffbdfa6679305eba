-- remax.run.report: where a run's metrics go besides metrics.jsonl (which is always written):
-- report_to as TRL spells it. "tensorboard" writes event files (remax.run.tensorboard) under
-- runs/<name>/tensorboard/, "csv" writes runs/<name>/metrics.csv, "none" nothing more, "all" both.
-- Services (wandb, mlflow, ...) are refused: the engine has no network dependency.
--
--   local reporters = report.open(run, { "tensorboard", "csv" }, { resume_step = 40 })
--   report.log(reporters, step, row);  report.close(reporters)
local M = {}

M.choices = { tensorboard = true, csv = true, none = true, all = true }
M.services = { wandb = "Weights & Biases", mlflow = "MLflow", comet_ml = "Comet", neptune = "Neptune",
  clearml = "ClearML", dagshub = "DagsHub", dvclive = "DVCLive", swanlab = "SwanLab", trackio = "Trackio",
  azure_ml = "Azure ML", codecarbon = "CodeCarbon", flyte = "Flyte", aim = "Aim" }

-- The error for a report_to entry that is not offered, or nil when it is.
function M.refusal(name)
  if M.choices[name] then return nil end
  if M.services[name] then
    return ("report_to = %s: %s is not supported (the engine has no network dependency); every step's metrics are in "
      .. "runs/<name>/metrics.jsonl, and report_to = tensorboard writes event files TensorBoard reads "
      .. "(a script can forward metrics.jsonl to %s)"):format(name, M.services[name], M.services[name])
  end
  return ("report_to = %s: expected tensorboard, csv, none or all (a list: --report_to tensorboard,csv)"):format(name)
end

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

local function flat(row)   -- only scalar values go into the table
  local out = {}
  for k, v in pairs(row) do
    if type(k) == "string" and (type(v) == "number" or type(v) == "string" or type(v) == "boolean") then out[k] = v end
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
function Tb:log(step, row) self.w:scalars(step, row) end
function Tb:close() self.w:close() end

-- The reporters of a run (remax.run.folder) for a report_to list. opts.resume_step: the step a
-- resumed run continues after.
function M.open(run, list, opts)
  opts = opts or {}
  for _, name in ipairs(list or {}) do
    local why = M.refusal(name)
    if why then error(why, 0) end
  end
  local want, out = M.wanted(list), {}
  if want.tensorboard then
    local w = require("remax.run.tensorboard").open(run.dir .. "/tensorboard",
      { resume_step = opts.resume_step and opts.resume_step + 1 or nil })
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

return M
