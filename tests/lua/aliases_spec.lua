-- Old module names (issue 43): one alias table (remax.deprecated.aliases) instead of a two-line
-- file per old name. An old name gives the new module and a note on stderr once, through the
-- package face and in scripts the remax program runs; REMAX_QUIET_DEPRECATED=1 silences the
-- note; requiring remax.deprecated by itself installs nothing (the face and the program's start
-- call register()).
local support = require("support")
local deprecated = require("remax.deprecated")

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

local function module_file(name)
  local base = "lua/" .. name:gsub("%.", "/")
  if exists(base .. ".lua") then return base .. ".lua" end
  if exists(base .. "/init.lua") then return base .. "/init.lua" end
end

-- stdout and stderr of a command, together
local function run(cmd)
  local p = assert(io.popen(cmd .. " 2>&1"))
  local out = p:read("*a")
  p:close()
  return out
end

local function count(text, plain)
  local _, n = text:gsub(plain:gsub("%p", "%%%0"), "")
  return n
end

local function note(old, new)
  return ('remax: require("%s") is deprecated: the module is now "%s" (use require("remax") where you can)'):format(old, new)
end

local LUAJIT = 'luajit -e \'package.path = "lua/?.lua;lua/?/init.lua;" .. package.path; %s\''

describe("the alias table of old module names", function()
  it("maps each old name to a module that exists, and no old name is a file of its own", function()
    for old, new in pairs(deprecated.aliases) do
      assert.is_truthy(old:match("^remax%."), old)
      assert.is_nil(module_file(old), old .. " is a file: it would load instead of " .. new)
      assert.is_not_nil(module_file(new), old .. " -> " .. new .. ": no such module")
      assert.is_nil(deprecated.aliases[new], new .. " is itself an old name")
    end
    -- the 46 names the redirect files kept, each still there
    local kept = {}
    for _, name in ipairs({ "algos", "chat", "config", "data", "dist", "fit", "gguf", "jinja", "lora", "model",
      "optim", "plot", "progress", "recipe", "reward_model", "rewards", "runs", "safetensors", "tensor", "tokenizer",
      "trainer" }) do kept[#kept + 1] = "remax." .. name end
    for _, name in ipairs({ "algos", "config", "data", "evaluate", "fit", "guard", "inert", "plot", "progress",
      "recipe", "reload", "report", "resume", "reward_worker", "rewards", "rollout", "run", "runs", "schema", "setup",
      "tensorboard", "trainer" }) do kept[#kept + 1] = "remax.train." .. name end
    for _, name in ipairs({ "gguf", "hf_cache", "hf_files" }) do kept[#kept + 1] = "remax.bind." .. name end
    assert.are.equal(46, #kept)
    for _, old in ipairs(kept) do
      assert.is_truthy(deprecated.aliases[old] or module_file(old), old .. " works no more")
    end
  end)

  it("gives the new module for an old name, with the note once per name, once the face is loaded", function()
    local olds = { "remax.lora", "remax.trainer", "remax.train.config", "remax.train.rollout", "remax.bind.gguf" }
    local lines = { 'require("remax")' }
    for _, old in ipairs(olds) do
      local new = deprecated.aliases[old]
      lines[#lines + 1] = ('local a = require("%s"); package.loaded["%s"] = nil; local b = require("%s"); '
        .. 'assert(a == b and a == require("%s"), "%s")'):format(old, old, old, new, old)
    end
    lines[#lines + 1] = 'io.stdout:write("same")'
    local out = run(LUAJIT:format(table.concat(lines, " ")))
    for _, old in ipairs(olds) do
      assert.are.equal(1, count(out, note(old, deprecated.aliases[old])), old .. ": " .. out)
    end
    assert.matches("same$", out)
  end)

  it("says nothing under REMAX_QUIET_DEPRECATED=1", function()
    local out = run("REMAX_QUIET_DEPRECATED=1 " .. LUAJIT:format(
      'require("remax"); assert(require("remax.data") == require("remax.formats.data")); io.stdout:write("same")'))
    assert.are.equal("same", out)
  end)

  it("works in a script the remax program runs (the program registers the table at its start)", function()
    local dir = support.tmpdir()
    local script = dir .. "/old_names.lua"
    support.write(script, [[
local a = require("remax.tokenizer")
local b = require("remax.train.runs")
assert(a == require("remax.bind.tokenizer") and b == require("remax.run.folder"))
io.stdout:write("same\n")
]])
    local out = run(("cd %s && %s run %s"):format(support.shell_quote(os.getenv("PWD") or "."),
      support.shell_quote(support.remax_binary()), support.shell_quote(script)))
    assert.are.equal(1, count(out, note("remax.tokenizer", "remax.bind.tokenizer")), out)
    assert.are.equal(1, count(out, note("remax.train.runs", "remax.run.folder")), out)
    assert.is_truthy(out:find("same\n", 1, true), out)
  end)

  it("installs nothing when remax.deprecated is merely required; register() installs the loader once", function()
    local out = run(LUAJIT:format('local d = require("remax.deprecated"); '
      .. 'local ok = pcall(require, "remax.lora"); io.stdout:write(ok and "found" or "not found"); '
      .. 'd.register(); d.register(); local n = 0; '
      .. 'for _, s in ipairs(package.loaders) do n = n + 1 end; '
      .. 'd.register(); local m = 0; for _, s in ipairs(package.loaders) do m = m + 1 end; '
      .. 'io.stdout:write(" ", tostring(n == m), " ", tostring(require("remax.lora") == require("remax.bind.lora")))'))
    assert.matches("not found true true$", out)
  end)

  it("leaves the message for a module that is neither a file nor an old name as Lua writes it", function()
    local out = run(LUAJIT:format('require("remax"); local ok, err = pcall(require, "remax.no_such_module"); '
      .. 'io.stdout:write(tostring(ok), " ", err)'))
    assert.matches("^false module 'remax.no_such_module' not found:", out)
  end)
end)
