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

-- The status text for a step: label, step/total, metrics, elapsed and ETA from the mean step
-- time since the progress began.
function Progress:format(step, m)
  m = m or {}
  local elapsed = self.clock() - self.t0
  if self.start_step == nil then self.start_step = step - 1 end
  local done = step - self.start_step
  local parts = { self.label }
  if self.total then
    local w = #tostring(self.total)
    parts[#parts + 1] = ("step %" .. w .. "d/%d"):format(step, self.total)
  else
    parts[#parts + 1] = ("step %d"):format(step)
  end
  if m.reward ~= nil then parts[#parts + 1] = "reward " .. fmt(m.reward, "%.3f") end
  if m.reward_greedy ~= nil then parts[#parts + 1] = "greedy " .. fmt(m.reward_greedy, "%.3f") end
  if m.kl ~= nil then parts[#parts + 1] = "kl " .. fmt(m.kl, "%.4g") end
  if m.loss ~= nil then parts[#parts + 1] = "loss " .. fmt(m.loss, "%.4g") end
  if m.reward_slow ~= nil then parts[#parts + 1] = "reward slow " .. fmt(m.reward_slow, "%.1fs") end
  if m.tokens_per_s ~= nil then parts[#parts + 1] = fmt(m.tokens_per_s, "%.0f") .. " tok/s" end
  parts[#parts + 1] = M.duration(elapsed)
  if self.total then
    local eta = "?"
    if done > 0 and elapsed > 0 then eta = M.duration(elapsed / done * math.max(self.total - step, 0)) end
    parts[#parts + 1] = "eta " .. eta
  end
  return table.concat(parts, "  ")
end

function Progress:update(step, metrics)
  local text = self:format(step, metrics)
  if self.tty then
    if #text >= self.width then text = text:sub(1, self.width - 1) end
    self.line = text
    self.out:write("\r", text, "\27[K")
  else
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
