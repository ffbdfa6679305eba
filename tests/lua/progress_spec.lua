local progress = require("remax.run.progress")

-- An output stream that records what is written, and a clock the test moves.
local function fake_out()
  local out = { text = "", flushes = 0 }
  function out:write(...)
    for _, s in ipairs({ ... }) do self.text = self.text .. tostring(s) end
    return self
  end
  function out:flush() self.flushes = self.flushes + 1 end
  return out
end

local function fake_clock(t)
  local c = { t = t or 1000 }
  c.fn = function() return c.t end
  return c
end

describe("progress", function()
  it("formats durations", function()
    assert.are.equal("00:00", progress.duration(0))
    assert.are.equal("01:15", progress.duration(75))
    assert.are.equal("1:02:05", progress.duration(3725))
    assert.are.equal("?", progress.duration(0 / 0))
    assert.are.equal("?", progress.duration(math.huge))
  end)

  it("prints one plain line per update when not on a terminal, with an ETA from the mean step time", function()
    local out, clock = fake_out(), fake_clock()
    local p = progress.new({ total = 10, label = "demo", out = out, tty = false, clock = clock.fn })
    clock.t = clock.t + 30
    p:update(1, { reward = 0.5, kl = 0.0123, tokens_per_s = 1234.4 })
    clock.t = clock.t + 30
    p:update(2, { reward = 0.25 })
    local lines = {}
    for line in out.text:gmatch("([^\n]*)\n") do lines[#lines + 1] = line end
    assert.are.equal(2, #lines)
    assert.is_nil(out.text:find("\r", 1, true))
    assert.is_nil(out.text:find("\27", 1, true))
    -- 30 s per step, 9 steps left after step 1: 4:30; 8 left after step 2: 4:00
    assert.matches("^demo  step  1/10  reward 0%.500  kl 0%.0123  1234 tok/s  00:30  eta 04:30$", lines[1])
    assert.matches("step  2/10  reward 0%.250  01:00  eta 04:00$", lines[2])
    assert.is_true(out.flushes >= 2)
  end)

  it("measures the ETA from the steps of this session when resuming", function()
    local out, clock = fake_out(), fake_clock()
    local p = progress.new({ total = 100, out = out, tty = false, clock = clock.fn })
    clock.t = clock.t + 10
    local text = p:update(91, {})            -- resumed after step 90: one step in 10 s
    assert.matches("eta 01:30$", text)
    local q = progress.new({ total = 100, out = out, tty = false, clock = clock.fn })
    assert.matches("eta %?$", q:format(1, {}))   -- no time has passed: no estimate yet
  end)

  it("redraws one live line on a terminal and logs above it", function()
    local out, clock = fake_out(), fake_clock()
    local p = progress.new({ total = 4, out = out, tty = true, clock = clock.fn })
    p.width = 200
    clock.t = clock.t + 2
    p:update(1, { reward = 1 })
    p:update(2, { reward = 0 / 0 })
    assert.is_nil(out.text:find("\n", 1, true))
    local _, redraws = out.text:gsub("\r", "")
    assert.are.equal(2, redraws)
    assert.truthy(out.text:find("\27[K", 1, true))
    assert.truthy(out.text:find("reward nan", 1, true))
    local before = #out.text
    p:log("saved checkpoints/step-2")
    local logged = out.text:sub(before + 1)
    -- clear the live line, print the message on its own line, draw the live line again
    assert.are.equal(1, logged:find("\r\27[K", 1, true))
    assert.truthy(logged:find("saved checkpoints/step-2\n", 1, true))
    assert.truthy(logged:find("step 2/4", 1, true))
    p:finish()
    assert.matches("\n$", out.text)
  end)

  it("cuts the live line to the terminal width so it never wraps", function()
    local out = fake_out()
    local p = progress.new({ total = 1000, label = string.rep("x", 80), out = out, tty = true, clock = fake_clock().fn })
    p.width = 40
    p:update(1, { reward = 0.1 })
    local line = out.text:match("\r(.-)\27%[K")
    assert.is_true(#line < 40)
  end)

  it("logs plain lines when not on a terminal", function()
    local out = fake_out()
    local p = progress.new({ total = 3, out = out, tty = false, clock = fake_clock().fn })
    p:log("hello")
    p:finish("done")
    assert.are.equal("hello\ndone\n", out.text)
  end)
end)
