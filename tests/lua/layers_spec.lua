-- The Lua library's layers hold (issue 43; docs/architecture.md, "Layers that hold"): the checker
-- tests/layers.lua finds no upward require, no circle and no C access outside bind/ in
-- lua/remax, and it finds each kind of problem, naming file:line, in small trees made here.
local layers = dofile("tests/layers.lua")
local support = require("support")

-- a tree under a temporary folder: files = { ["run/a.lua"] = "source", ... } (under lua/remax/)
local function tree(files)
  local root = support.tmpdir()
  for path, src in pairs(files) do
    local full = root .. "/lua/remax/" .. path
    os.execute("mkdir -p " .. support.shell_quote(full:match("^(.*)/[^/]*$")))
    support.write(full, src)
  end
  return root
end

local function has(problems, pattern)
  for _, p in ipairs(problems) do if p:find(pattern, 1, true) then return true end end
  return false
end

describe("lua/remax's layers", function()
  it("hold: every require goes down, nothing requires in a circle, only bind/ touches C", function()
    local problems = layers.check(".", { aliases = require("remax.deprecated").aliases })
    assert.are.same({}, problems)
  end)

  it("are listed top first as the docs say, each folder of lua/remax in one", function()
    local names = {}
    for i, l in ipairs(layers.LAYERS) do names[i] = l.name end
    assert.are.same({ "cli", "face", "run", "step", "settings", "formats/text/tasks", "bind" }, names)
    local f = assert(io.open("docs/architecture.md", "rb"))
    local doc = f:read("*a")
    f:close()
    assert.is_truthy(doc:find("cli → remax (the face) → run → step → settings → formats/text/tasks → bind", 1, true),
      "docs/architecture.md states the order")
  end)
end)

describe("tests/layers.lua", function()
  it("names an upward require with its file and line, also one inside a function", function()
    local root = tree({
      ["settings/config.lua"] = 'local M = {}\n\nfunction M.f()\n  return require("remax.step.algos").x\nend\nreturn M\n',
      ["step/algos.lua"] = "return {}\n",
    })
    local problems = layers.check(root)
    assert.are.same({ 'lua/remax/settings/config.lua:4: require("remax.step.algos"): requires up, from settings/ '
      .. "(layer settings) to step/ (layer step)" }, problems)
  end)

  it("reads require \"x\", pcall(require, \"x\") and requires in strings and comments for what they are", function()
    local root = tree({
      ["bind/a.lua"] = '-- require("remax.run.run") in a comment\nlocal s = "require(\\"remax.run.run\\")"\n'
        .. '--[[ require("remax.run.run")\n]]\nlocal ok = pcall(require, "remax.run.run")\nlocal r = require "remax.run.run"\n',
      ["run/run.lua"] = "return {}\n",
    })
    local problems = layers.check(root)
    assert.are.equal(2, #problems, table.concat(problems, "\n"))
    assert.is_true(has(problems, 'lua/remax/bind/a.lua:5: pcall(require, "remax.run.run"): requires up'))
    assert.is_true(has(problems, 'lua/remax/bind/a.lua:6: require "remax.run.run": requires up'))
  end)

  it("names a circle between files and one between folders", function()
    local root = tree({
      ["run/folder.lua"] = 'local h = require("remax.run.history")\nreturn {}\n',
      ["run/history.lua"] = '\nlocal f = require("remax.run.folder")\nreturn {}\n',
      ["formats/x.lua"] = 'return require("remax.text.y")\n',
      ["text/y.lua"] = '\n\nreturn require("remax.formats.z")\n',
      ["formats/z.lua"] = "return {}\n",
    })
    local problems = layers.check(root)
    assert.is_true(has(problems, "lua/remax/run/folder.lua:1: files require each other in a circle: run/folder.lua -> "
      .. "run/history.lua -> run/folder.lua (at lua/remax/run/folder.lua:1, lua/remax/run/history.lua:2)"), table.concat(problems, "\n"))
    assert.is_true(has(problems, "folders require each other in a circle: formats/ -> text/ -> formats/ "
      .. "(at lua/remax/formats/x.lua:1, lua/remax/text/y.lua:3)"), table.concat(problems, "\n"))
  end)

  it("refuses a require it cannot read, an old name, a missing module and a folder in no layer", function()
    local root = tree({
      ["run/a.lua"] = 'local name = "remax.step.b"\nlocal b = require(name)\nlocal c = require("remax.train.config")\n'
        .. 'local d = require("remax.run.nothing")\n',
      ["step/b.lua"] = "return {}\n",
      ["extra/e.lua"] = "return {}\n",
    })
    local problems = layers.check(root, { aliases = { ["remax.train.config"] = "remax.settings.config" } })
    assert.is_true(has(problems, "lua/remax/run/a.lua:2: require(name): a require whose module is not a string cannot be checked"))
    assert.is_true(has(problems, 'lua/remax/run/a.lua:3: require("remax.train.config"): an old name; the module is "remax.settings.config"'))
    assert.is_true(has(problems, 'lua/remax/run/a.lua:4: require("remax.run.nothing"): no such module under lua/remax'))
    assert.is_true(has(problems, "lua/remax/extra/e.lua:1: lua/remax/extra/ is in no layer"))
  end)

  it("names C access outside bind/ and leaves LuaJIT's plain byte buffers alone", function()
    local root = tree({
      ["formats/g.lua"] = table.concat({
        'local ffi = require("ffi")',
        "local buf = ffi.new(\"uint8_t[?]\", 8)",
        "local s = ffi.string(buf, 8)",
        'pcall(ffi.cdef, "int getpid(void);")',
        "local pid = ffi.C.getpid()",
        'local cfg = ffi.new("rx_model_config")',
        'local C = require("remax.bind.ffi").C',
        "local e = ffi.errno()",
        'local h = require("ffi").load("m")',
      }, "\n") .. "\n",
      ["bind/ffi.lua"] = "return {}\n",
      ["bind/ok.lua"] = 'local ffi = require("ffi")\nlocal C = ffi.C\nreturn ffi.new("rx_tensor")\n',
    })
    local problems = layers.check(root)
    assert.are.same({
      "lua/remax/formats/g.lua:4: ffi.cdef: C access outside bind/ (bind/ is the only door to C: call a bind/ function)",
      "lua/remax/formats/g.lua:5: ffi.C: C access outside bind/ (bind/ is the only door to C: call a bind/ function)",
      'lua/remax/formats/g.lua:6: ffi.new("rx_model_config"): an engine type: C access outside bind/ (bind/ is the only door to C: call a bind/ function)',
      'lua/remax/formats/g.lua:7: require("remax.bind.ffi"): the engine\'s C handle outside bind/ (bind/ is the only door to C)',
      "lua/remax/formats/g.lua:8: ffi.errno: C access outside bind/ (bind/ is the only door to C: call a bind/ function)",
      "lua/remax/formats/g.lua:9: ffi.load: C access outside bind/ (bind/ is the only door to C: call a bind/ function)",
    }, problems)
  end)

  it("exits 1 and prints each problem when run as a program, 0 on a tree that holds", function()
    local root = tree({ ["bind/a.lua"] = 'return require("remax.step.b")\n', ["step/b.lua"] = "return {}\n" })
    local script = os.getenv("PWD") .. "/tests/layers.lua"
    local p = io.popen(("cd %s && luajit %s 2>&1; echo rc=$?"):format(support.shell_quote(root), support.shell_quote(script)))
    local out = p:read("*a")
    p:close()
    assert.is_truthy(out:find('lua/remax/bind/a.lua:1: require("remax.step.b"): requires up', 1, true), out)
    assert.matches("rc=1%s*$", out)
    p = io.popen("luajit tests/layers.lua 2>&1; echo rc=$?")
    out = p:read("*a")
    p:close()
    assert.matches("rc=0%s*$", out)
  end)
end)
