-- REMAX_DEBUG=1: a failure inside training prints the Lua traceback of where it was raised, once
-- (the Run's catches and the command's handler each used to drop it or add their own).
local support = require("support")

describe("REMAX_DEBUG", function()
  local function run(debug)
    local dir = support.tmpdir()
    local recipe = dir .. "/fails_later.lua"
    support.write(recipe, [[
local remax = require("remax")
local calls = 0
local function flaky(completions)
  calls = calls + 1
  if calls > 1 then error("the second call fails") end   -- the start-up probe is the first
  local out = {}
  for i = 1, #completions do out[i] = 0 end
  return out
end
return { data = remax.tasks.gsm8k.synthetic(), rewards = { flaky }, max_steps = 1, eval_size = 0,
  per_device_train_batch_size = 2, num_generations = 2, max_completion_length = 8, hot_reload = false }
]])
    local p = io.popen(("cd %s && %s OMP_NUM_THREADS=1 %s run %s --output_dir %s 2>&1"):format(
      support.shell_quote(dir), debug and "REMAX_DEBUG=1" or "env -u REMAX_DEBUG", support.remax_binary(),
      support.shell_quote(recipe), support.shell_quote(dir .. "/runs")))
    local out = p:read("*a")
    p:close()
    return out
  end

  it("keeps the traceback of an error raised inside a training step, once", function()
    local out = run(true)
    assert.matches("the second call fails", out, 1, true)
    local _, n = out:gsub("stack traceback:", "")
    assert.are.equal(1, n, out)
    assert.matches("fails_later.lua:5: in function", out, 1, true)
  end)

  it("prints no traceback without it", function()
    local out = run(false)
    assert.matches("the second call fails", out, 1, true)
    assert.is_nil(out:find("stack traceback:", 1, true), out)
  end)
end)
