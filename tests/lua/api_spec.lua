-- The public Lua API (issue 36, item 10): require("remax") exposes every documented module
-- under a name that stays put; the names of modules that moved keep working (with a note on
-- stderr, once); the docs and recipes use only the face.
local support = require("support")

-- The public names, pinned: removing one breaks recipes.
local PUBLIC = { "tensor", "optim", "model", "lora", "reward_model", "safetensors", "gguf", "tokenizer", "dist",
  "chat", "jinja", "data", "runs", "progress", "plot", "tensorboard", "config", "algos", "trainer", "recipe",
  "rewards", "fit" }
-- Names documented before the reorganisation into bind/ text/ train/ (commit ac2757b).
local OLD = { "tensor", "optim", "model", "lora", "reward_model", "safetensors", "gguf", "tokenizer", "dist",
  "chat", "jinja", "data", "runs", "progress", "plot", "config", "algos", "trainer", "recipe", "rewards", "fit" }

local function ls(pattern)
  local out = {}
  local p = io.popen("ls " .. pattern .. " 2>/dev/null")
  for f in p:lines() do out[#out + 1] = f end
  p:close()
  return out
end

describe("require('remax')", function()
  local remax = require("remax")

  it("exposes every public module, each a table of functions", function()
    for _, name in ipairs(PUBLIC) do
      local mod = remax[name]
      assert.are.equal("table", type(mod), "remax." .. name)
      local fns = 0
      for _, v in pairs(mod) do if type(v) == "function" then fns = fns + 1 end end
      assert.is_true(fns > 0, "remax." .. name .. " has no functions")
      assert.are.equal(require(remax.modules[name]), mod, "remax." .. name)
    end
    assert.are.equal("table", type(remax.tasks.gsm8k))
    assert.are.equal(require("remax.tasks.gsm8k_synth"), remax.tasks.gsm8k_synth)
    assert.is_nil(remax.tasks.no_such_task)
    assert.is_nil(remax.no_such_module)
  end)

  it("keeps the old module names working, with a deprecation note on stderr once per name", function()
    for _, name in ipairs(OLD) do
      -- in a fresh process that loaded the face: the note, once, naming the new spelling, and
      -- the same module (tests/lua/aliases_spec.lua: the alias table, the program's scripts)
      local cmd = ("luajit -e 'package.path = \"lua/?.lua;lua/?/init.lua;\" .. package.path; "
        .. "require(\"remax\"); local a = require(\"remax.%s\"); package.loaded[\"remax.%s\"] = nil; local b = require(\"remax.%s\"); "
        .. "assert(a == b and a == require(\"remax\").%s); io.stdout:write(\"same\")' 2>&1"):format(name, name, name, name)
      local p = io.popen(cmd)
      local out = p:read("*a")
      p:close()
      local note = ('remax: require("remax.%s") is deprecated: the module is now "%s"'):format(name, require("remax").modules[name])
      local _, count = out:gsub(note:gsub("%p", "%%%0"), "")
      assert.are.equal(1, count, name .. ": " .. out)
      assert.matches("same$", out, nil, false)
    end
  end)

  it("is the only way the docs and recipes load remax modules", function()
    local files = ls("docs/*.md README.md recipes/*.lua")
    assert.is_true(#files > 10)
    local public = {}
    for _, name in ipairs(PUBLIC) do public[name] = true end
    for _, path in ipairs(files) do
      local text = support.read(path)
      -- a paragraph about the deprecated names may name them
      local kept = {}
      for par in (text:gsub("\n%s*\n", "\0") .. "\0"):gmatch("([^%z]*)%z") do
        if not par:find("deprecat") then kept[#kept + 1] = par end
      end
      text = table.concat(kept, "\n\n")
      for mod in text:gmatch('require%(?%s*"(remax[%w%._]*)"') do
        assert.are.equal("remax", mod, path .. ": require(\"" .. mod .. "\"): use require(\"remax\").<name>")
      end
      -- every require("remax").<name> names a public module (or tasks)
      for name in text:gmatch('require%("remax"%)%.([%w_]+)') do
        assert.is_true(public[name] or name == "tasks", path .. ": require(\"remax\")." .. name .. " is not public")
      end
    end
  end)
end)
