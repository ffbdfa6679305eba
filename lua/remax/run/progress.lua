-- remax.run.progress: training progress. On a terminal one live line, redrawn in place; otherwise
-- (a log file, a pipe, a batch job) one plain line per update.
--
--   local progress = require("remax.run.progress").new({ total = 200, label = "gsm8k" })
--   progress:update(step, { reward = 0.41, kl = 0.002, tokens_per_s = 5300 })
--   progress:log("saved checkpoints/step-50")     -- printed above the live line
--   progress:finish()
local fs = require("remax.bind.fs")

local M = {}
local Progress = {}
Progress.__index = Progress
M.Progress = Progress

local now = require("remax.bind.clock").now
local is_tty, columns = fs.is_tty, fs.columns

-- 75 -> "01:15", 3725 -> "1:02:05".
function M.duration(s)
  if type(s) ~= "number" or s ~= s or s == math.huge or s < 0 then return "?" end
  s = math.floor(s + 0.5)
  local h, m, sec = math.floor(s / 3600), math.floor(s / 60) % 60, s % 60
  if h > 0 then return ("%d:%02d:%02d"):format(h, m, sec) end
  return ("%02d:%02d"):format(m, sec)
end

local function fmt(v, spec)
  if type(v) ~= "number" then return tostring(v) end
  if v ~= v then return "nan" end
  return spec:format(v)
end

-- Whether a live line (carriage returns, erase-line escapes) suits this output: a terminal, not
-- TERM=dumb, and not a process an MPI or Slurm launcher started (Open MPI hands its ranks a
-- pseudo-terminal even when mpirun's own output goes to a file, so isatty says yes there).
M.LAUNCHER_VARS = { "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID", "MPI_LOCALNRANKS" }
function M.live(fd)
  if os.getenv("TERM") == "dumb" then return false end
  for _, v in ipairs(M.LAUNCHER_VARS) do if os.getenv(v) then return false end end
  return is_tty(fd)
end

-- opts: total (steps), label, out (a stream with :write and :flush; default io.stdout),
-- tty (force the live-line mode on or off), clock (a function returning seconds), start_step
-- (the step the run resumed after; default: the first update's step - 1).
function M.new(opts)
  opts = opts or {}
  local out = opts.out or io.stdout
  local fd = (out == io.stderr) and 2 or 1
  local tty = opts.tty
  if tty == nil then tty = (out == io.stdout or out == io.stderr) and M.live(fd) end
  local clock = opts.clock or now
  return setmetatable({
    total = opts.total, label = opts.label or "remax", out = out, tty = tty, fd = fd,
    clock = clock, t0 = clock(), start_step = opts.start_step, line = nil,
    width = tty and columns(fd) or nil,
  }, Progress)
end

-- The fields of a step's status, in order: {text, drop} where drop ranks what goes first when
-- the line is too wide (nil: never dropped).
function Progress:fields(step, m)
  m = m or {}
  local elapsed = self.clock() - self.t0
  if self.start_step == nil then self.start_step = step - 1 end
  local done = step - self.start_step
  local f = { { self.label, 4 } }
  if self.total then
    local w = #tostring(self.total)
    f[#f + 1] = { ("step %" .. w .. "d/%d"):format(step, self.total) }
  else
    f[#f + 1] = { ("step %d"):format(step) }
  end
  if m.reward ~= nil then f[#f + 1] = { "reward " .. fmt(m.reward, "%.3f"), 9 } end
  if m.reward_greedy ~= nil then f[#f + 1] = { "greedy " .. fmt(m.reward_greedy, "%.3f"), 7 } end
  if m.kl ~= nil then f[#f + 1] = { "kl " .. fmt(m.kl, "%.4g"), 5 } end
  if m.loss ~= nil then f[#f + 1] = { "loss " .. fmt(m.loss, "%.4g"), 2 } end
  if m.reward_slow ~= nil then f[#f + 1] = { "reward slow " .. fmt(m.reward_slow, "%.1fs"), 6 } end
  if m.tokens_per_s ~= nil then f[#f + 1] = { fmt(m.tokens_per_s, "%.0f") .. " tok/s", 1 } end
  f[#f + 1] = { M.duration(elapsed), 3 }
  if self.total then
    local eta = "?"
    if done > 0 and elapsed > 0 then eta = M.duration(elapsed / done * math.max(self.total - step, 0)) end
    f[#f + 1] = { "eta " .. eta, 8 }
  end
  -- a warning (most of the step's episodes failed, and the most frequent error) is never left
  -- out: on a terminal it is cut to what the line has room for
  if m.warning then f[#f + 1] = { "warning: " .. tostring(m.warning), nil, warning = true } end
  return f
end

local SEP = "  "

local function joined(f)
  local parts = {}
  for _, x in ipairs(f) do if x[1] then parts[#parts + 1] = x[1] end end
  return table.concat(parts, SEP)
end

-- The status text for a step: label, step/total, metrics (reward, greedy reward, kl, loss, ...),
-- elapsed and ETA from the mean step time since the progress began. width: the most columns
-- it may take (a terminal's width less one); to fit, a long label is shortened first, then
-- whole fields are left out, the least telling first (tok/s, loss, elapsed, label, kl, ...),
-- never a field cut in the middle.
function Progress:format(step, m, width)
  local f = self:fields(step, m)
  local text = joined(f)
  if not width or #text <= width then return text end
  local warning = f[#f].warning and f[#f][1]
  if warning then   -- the other fields give way first, leaving the warning 40 columns
    local others = self:format(step, setmetatable({ warning = false }, { __index = m }),
      math.max(width - math.min(#warning, 40) - #SEP, 1))
    local room = width - #others - #SEP
    if #warning > room then warning = warning:sub(1, math.max(room - 3, 0)) .. "..." end
    return others .. SEP .. warning
  end
  local label = f[1][1]
  if #label > 12 then
    f[1][1] = label:sub(1, 11) .. "~"
    text = joined(f)
    if #text <= width then return text end
  end
  while #text > width do
    local worst, at = -1, nil
    for i, x in ipairs(f) do
      if x[1] and x[2] and x[2] < 100 and (worst < 0 or x[2] < worst) then worst, at = x[2], i end
    end
    if not at then break end
    f[at][1] = nil
    text = joined(f)
  end
  return text
end

function Progress:update(step, metrics)
  local text
  if self.tty then
    text = self:format(step, metrics, (self.width or 80) - 1)
    self.line = text
    self.out:write("\r", text, "\27[K")
  else
    text = self:format(step, metrics)
    self.out:write(text, "\n")
  end
  self.out:flush()
  return text
end

-- A passing status after the live line, on a terminal only ("eval 128/500 prompts" while an
-- evaluation runs); the next update draws the line without it. Off a terminal nothing is written,
-- so logs stay one line per step.
function Progress:status(text)
  if not self.tty then return end
  local line = (self.line and (self.line .. "  ") or "") .. tostring(text)
  if self.width and #line >= self.width then line = line:sub(1, self.width - 1) end
  self.out:write("\r", line, "\27[K")
  self.out:flush()
end

-- A model:generate on_token callback that shows "generating: token 37/256" as a status about
-- twice a second (nil off a terminal: nothing to show, nothing to call).
function Progress:ticker(format)
  if not self.tty then return nil end
  local last = self.clock()
  return function(step, _, _, max_new)
    local t = self.clock()
    if t - last >= 0.5 then
      last = t
      self:status(format:format(step, max_new))
    end
  end
end

-- Prints a message; on a terminal it goes above the live line, which is drawn again.
function Progress:log(text)
  if self.tty and self.line then
    self.out:write("\r\27[K", tostring(text), "\n", self.line, "\27[K")
  else
    self.out:write(tostring(text), "\n")
  end
  self.out:flush()
end

-- Ends the live line (the terminal cursor moves past it); message: an optional last line.
function Progress:finish(message)
  if self.tty and self.line then self.out:write("\n") end
  self.line = nil
  if message then self.out:write(tostring(message), "\n") end
  self.out:flush()
end

return M
