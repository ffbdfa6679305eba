-- The Run (lua/remax/run/) and the Step (lua/remax/step/) are two owners with a small interface
-- (docs/architecture.md, "A Run and a Step"): no field of the Step is written by Run code, none
-- of the Run by Step code, no Lua file grows past the size a reader holds in mind, and nothing
-- reaches back up through the package face or wires itself in by being required.
local fs = require("remax.bind.fs")

local function lines_of(path)
  local list = {}
  for line in io.lines(path) do list[#list + 1] = line end
  return list
end

local function lua_files(dir)
  local list = {}
  local p = io.popen("find " .. dir .. " -name '*.lua' | sort")
  for f in p:lines() do list[#list + 1] = f end
  p:close()
  return list
end

-- every "X.field = " / "X.field[...] = " assignment in a file, with X the given receiver names
local function writes(path, receivers)
  local found = {}
  for n, line in ipairs(lines_of(path)) do
    local code = line:gsub("%-%-.*$", "")
    for _, recv in ipairs(receivers) do
      for field in code:gmatch(recv .. "%.([%a_][%w_]*)%s*=[^=]") do
        found[#found + 1] = ("%s:%d: %s.%s"):format(path, n, recv, field)
      end
    end
  end
  return found
end

describe("the Run and the Step", function()
  it("the Run's code never writes a field of the Step (it asks through a method)", function()
    local bad = {}
    for _, f in ipairs(lua_files("lua/remax/run")) do
      for _, w in ipairs(writes(f, { "self%.stepper", "stepper", "run%.stepper" })) do bad[#bad + 1] = w end
    end
    assert.are.same({}, bad)
  end)

  it("the Step's code never writes a field of the Run, and never requires the Run's modules", function()
    local bad = {}
    for _, f in ipairs(lua_files("lua/remax/step")) do
      for n, line in ipairs(lines_of(f)) do
        local code = line:gsub("%-%-.*$", "")
        if code:match('require%("remax%.run%.') then bad[#bad + 1] = ("%s:%d: requires %s"):format(f, n, code) end
        for field in code:gmatch("self%.run%.([%a_][%w_]*)%s*=[^=]") do bad[#bad + 1] = ("%s:%d: self.run.%s"):format(f, n, field) end
      end
    end
    assert.are.same({}, bad)
  end)

  it("the Step's fields are written only in lua/remax/step/, the Run's only in lua/remax/run/", function()
    -- a field of the Step object that a run/ file assigns through "self." would mean the Run's
    -- methods are installed on the Step (a mixin): the two must not share a table
    local step_src = table.concat(lines_of("lua/remax/step/step.lua"), "\n")
    assert.is_nil(step_src:match("require%(\"remax%.run%."), "the Step requires nothing of the Run")
    local run_src = table.concat(lines_of("lua/remax/run/run.lua"), "\n")
    assert.is_nil(run_src:match("%.methods%)"), "no methods copied in from other modules")
    assert.is_nil(step_src:match("for name, fn in pairs%("), "no methods copied in from other modules")
  end)

  it("every step type implements the Step interface, and no step has modes", function()
    local step = require("remax.step.step")
    local names = {}
    for algo, kind in pairs(step.TYPES) do
      names[#names + 1] = algo
      for _, method in ipairs(step.INTERFACE) do
        assert.is_function(kind.Step[method], ("the %s step lacks Step:%s"):format(algo, method))
      end
    end
    table.sort(names)
    assert.are.same({ "reward", "rl", "sft" }, names)
    assert.are.equal(step.TYPES.sft, step.type_of({ algo = "sft" }))
    assert.are.equal(step.TYPES.reward, step.type_of({ algo = "reward" }))
    assert.are.equal(step.TYPES.rl, step.type_of({ algo = "grpo" }))
    -- a step type is a file of its own: no code in step/ asks which algo is SFT or a reward model
    local bad = {}
    for _, f in ipairs(lua_files("lua/remax/step")) do
      for n, line in ipairs(lines_of(f)) do
        local code = line:gsub("%-%-.*$", "")
        if code:match('algo%s*[~=]=%s*"sft"') or code:match('algo%s*[~=]=%s*"reward"') then
          bad[#bad + 1] = ("%s:%d: %s"):format(f, n, code)
        end
      end
    end
    assert.are.same({}, bad)
  end)

  it("the Run asks the Step through its methods, never reading a field of it", function()
    local bad = {}
    for _, f in ipairs(lua_files("lua/remax/run")) do
      for n, line in ipairs(lines_of(f)) do
        local code = line:gsub("%-%-.*$", "")
        -- stepper.x not followed by "(": a field read (pcall(stepper.m, stepper, ...) calls method m)
        for field in code:gmatch("stepper%.([%a_][%w_]*)") do
          if not code:match("pcall%(self%.stepper%." .. field .. ", self%.stepper") then
            bad[#bad + 1] = ("%s:%d: stepper.%s"):format(f, n, field)
          end
        end
      end
    end
    assert.are.same({}, bad)
  end)

  it("no Lua module is over about 600 lines, except the self-contained Jinja interpreter and GGUF writer", function()
    local long = {}
    for _, f in ipairs(lua_files("lua/remax")) do
      local n = #lines_of(f)
      if n > 650 and not f:match("text/jinja%.lua$") and not f:match("formats/gguf%.lua$") then
        long[#long + 1] = ("%s: %d lines"):format(f, n)
      end
    end
    assert.are.same({}, long)
  end)

  it("no module reaches back up through the package face, and bind/ holds bindings only", function()
    local bad = {}
    for _, f in ipairs(lua_files("lua/remax")) do
      if not f:match("lua/remax/init%.lua$") and not f:match("lua/remax/cli/") then
        for n, line in ipairs(lines_of(f)) do
          if line:gsub("%-%-.*$", ""):match('require%("remax"%)') then bad[#bad + 1] = ("%s:%d"):format(f, n) end
        end
      end
    end
    assert.are.same({}, bad)
    -- (bind/hf_files.lua, the checks of a folder's JSON files, is read by the model and tokenizer
    -- bindings, the bottom layer, so it lives beside them)
    for _, f in ipairs(lua_files("lua/remax/bind")) do
      assert.is_nil(f:match("gguf") or f:match("hf_cache"), f .. " is a format, not a binding (lua/remax/formats/)")
    end
  end)

  it("requiring remax.bind.lora changes nothing; register() installs the adapter loader", function()
    local model = require("remax.bind.model")
    local saved = model.adapter_loader
    model.adapter_loader = nil
    package.loaded["remax.bind.lora"] = nil
    local lora = require("remax.bind.lora")
    assert.is_nil(model.adapter_loader, "a require must not wire the loader in")
    lora.register()
    assert.are.equal(lora.load_with_base, model.adapter_loader)
    model.adapter_loader = saved or lora.load_with_base
  end)

  it("old module names keep working and name the new one", function()
    require("remax.deprecated").register()   -- as the package face and the remax program do
    assert.are.equal(require("remax.run.run"), require("remax.train.trainer"))
    assert.are.equal(require("remax.step.algos"), require("remax.train.algos"))
    assert.are.equal(require("remax.formats.gguf"), require("remax.bind.gguf"))
    assert.is_true(fs.exists("lua/remax/deprecated.lua"))
    assert.is_false(fs.exists("lua/remax/train"), "old names live in remax.deprecated's table, not in files")
  end)
end)
