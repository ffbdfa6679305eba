local remax = require("remax")
local tensor, safetensors = remax.tensor, remax.safetensors

local tmpdir = require("support").tmpdir

describe("safetensors", function()
  local dir
  before_each(function() dir = tmpdir() end)
  after_each(function() os.execute("rm -rf '" .. dir .. "'") end)

  it("round-trips tensors and metadata through save and open", function()
    local w = tensor.from({ { 1, -2, 3 }, { 4.5, 0, -6 } }, "bf16")
    local ids = tensor.from({ 7, 8, 9, 10 }, "i64")
    local path = dir .. "/model.safetensors"
    safetensors.save(path, { ["model.w"] = w, ["a.ids"] = ids }, { format = "pt", step = 12 })

    local st = safetensors.open(path)
    assert.are.same({ "a.ids", "model.w" }, st:names())
    assert.is_true(st:has("model.w"))
    assert.are.same({ dtype = "bf16", format = "BF16", shape = { 2, 3 } }, st:info("model.w"))
    assert.are.same(w:totable(), st:read("model.w"):totable())
    local wide = st:read("model.w", "f64")
    assert.are.equal("f64", wide:dtype_name())
    assert.are.same(w:totable(), wide:totable())
    assert.are.same(ids:totable(), st:read("a.ids"):totable())
    assert.are.same({ format = "pt", step = "12" }, st:metadata())
    st:close()
    -- opening the directory finds model.safetensors
    assert.are.same({ "a.ids", "model.w" }, safetensors.open(dir):names())
  end)

  it("reads into an existing tensor and reports a shape mismatch", function()
    local path = dir .. "/m.safetensors"
    safetensors.save(path, { w = tensor.from({ { 1, 2 }, { 3, 4 } }, "f32") })
    local st = safetensors.open(path)
    local dst = tensor.new({ 2, 2 }, "f64")
    assert.are.same({ { 1, 2 }, { 3, 4 } }, st:read_into("w", dst):totable())
    assert.has_error(function() st:read_into("w", tensor.new({ 2, 3 }, "f32")) end,
      "w: shape [2,2] in " .. path .. ", destination wants [2,3]")
  end)

  it("names the file in the error for a missing file", function()
    local path = dir .. "/missing.safetensors"
    local ok, err = pcall(safetensors.open, path)
    assert.is_false(ok)
    assert.matches(path .. ": cannot open: No such file", err, 1, true)
  end)

  it("rejects non-tensor values and bad metadata on save", function()
    assert.has_error(function() safetensors.save(dir .. "/x.safetensors", { w = 3 }) end,
      "safetensors.save: 'w' is a number, expected a tensor")
    assert.has_error(function()
      safetensors.save(dir .. "/x.safetensors", { w = tensor.new({ 1 }) }, { bad = {} })
    end, "safetensors.save: metadata 'bad' is a table, expected a string")
  end)
end)
