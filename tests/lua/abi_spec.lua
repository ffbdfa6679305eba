-- The header is read by LuaJIT at run time; this checks that LuaJIT lays out every struct
-- exactly as the C compiler did.
local ffi = require("ffi")
local rx = require("remax.bind.ffi")

describe("remax.h ABI", function()
  local layout = {}
  for name, value in ffi.string(rx.C.rx_abi_layout()):gmatch("(%S+) (%d+)") do layout[name] = tonumber(value) end

  local header = io.open(rx.header_path):read("*a")
  local structs = {}
  for body, name in rx.declarations(header):gmatch("typedef struct [%w_]+ (%b{}) ([%w_]+);") do
    structs[#structs + 1] = { name = name, body = body }
  end

  it("lists at least the tensor struct", function()
    assert.is_true(#structs >= 1)
  end)

  it("matches C sizeof and offsetof for every struct and field", function()
    for _, s in ipairs(structs) do
      assert.are.equal(layout[s.name], ffi.sizeof(s.name), "sizeof " .. s.name)
      for field in s.body:gsub("/%*.-%*/", ""):gmatch("([%w_]+)%s*[%[;]") do
        local key = s.name .. "." .. field
        assert.is_not_nil(layout[key], key .. " missing from rx_abi_layout (engine/core/abi.c)")
        assert.are.equal(layout[key], ffi.offsetof(s.name, field), "offsetof " .. key)
      end
    end
  end)

  it("turns a failing status into a Lua error with the engine's message", function()
    local out = ffi.new("int32_t[1]")
    local ok, err = pcall(rx.check, rx.C.rx_dtype_from_name("nope", out))
    assert.is_false(ok)
    assert.matches("unknown dtype 'nope'", err)
  end)
end)
