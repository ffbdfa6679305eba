local remax = require("remax")
local tensor = remax.tensor

describe("tensor", function()
  it("round-trips nested tables through every dtype", function()
    local src = { { 1, -2, 3 }, { 4.5, 0, -6 } }
    for _, dt in ipairs({ "f32", "f64", "bf16", "f16" }) do
      local t = tensor.from(src, dt)
      assert.are.same({ 2, 3 }, t:size())
      assert.are.equal(dt, t:dtype_name())
      assert.are.same(src, t:totable())
    end
    assert.are.same({ { 1, -2, 3 }, { 4, 0, -6 } }, tensor.from(src, "i32"):totable())
    assert.are.same({ { 1, -2, 3 }, { 4, 0, -6 } }, tensor.from(src, "i64"):totable())
  end)

  it("gets and sets by 1-based indices and rejects out-of-range ones", function()
    local t = tensor.new({ 2, 3 }, "f32")
    t:set(2, 3, 7.5)
    assert.are.equal(7.5, t:get(2, 3))
    assert.are.equal(7.5, t:values()[6])
    assert.has_error(function() t:get(3, 1) end, "index 3 out of range 1..2 in dim 1")
  end)

  it("makes views that share storage", function()
    local t = tensor.from({ { 1, 2, 3, 4 }, { 5, 6, 7, 8 } })
    local v = t:narrow(2, 2, 2)
    assert.are.same({ { 2, 3 }, { 6, 7 } }, v:totable())
    v:set(1, 1, 20)
    assert.are.equal(20, t:get(1, 2))
    assert.are.same({ 8 }, t:reshape({ -1 }):size())
    assert.has_error(function() v:reshape({ 4 }) end)
  end)

  it("converts dtypes with copy and to()", function()
    local t = tensor.from({ 1.5, 2.25, -3.125 }, "f64")
    assert.are.same({ 1.5, 2.25, -3.125 }, t:to("bf16"):to("f32"):totable())
    assert.are.same({ 1, 2, -3 }, t:to("i32"):totable())
  end)

  it("fills with Philox randoms that depend only on (seed, offset)", function()
    local a = tensor.new({ 10 }, "f64"):normal_(5, 0)
    local b = tensor.new({ 4 }, "f64"):normal_(5, 6)
    for i = 1, 4 do assert.are.equal(a:get(6 + i), b:get(i)) end
    local c = tensor.new({ 10 }, "f64"):normal_(6, 0)
    assert.are_not.equal(a:get(1), c:get(1))
  end)

  it("raises clear errors for bad input", function()
    assert.has_error(function() tensor.new({ 2 }, "f8") end, "unknown dtype 'f8' (valid: f32, f64, bf16, f16, i32, i64)")
    assert.has_error(function() tensor.from({ { 1, 2 }, { 3 } }) end)
    assert.has_error(function() tensor.from({ 1, "x" }) end)
    assert.has_error(function() tensor.new({ 1, 2, 3, 4, 5 }) end, "tensors have at most 4 dims, got 5")
    assert.has_error(function() tensor.new({ 2 }, "f32", "tpu") end, "unknown device 'tpu' (valid: cpu, cuda)")
  end)

  it("converts dtype with to() on the cpu, naming the dtype or the device in either order", function()
    local t = tensor.from({ 1.5, -2 }, "f32")
    local b = t:to("bf16")
    assert.are.equal("bf16", b:dtype_name())
    assert.are.equal("cpu", b:device_name())
    assert.are.same({ 1.5, -2 }, t:to("f64", "cpu"):totable())
  end)

  if tensor.has_cuda() then
    it("moves to and from the cuda device and reads device memory with totable", function()
      local src = { { 1, -2, 3 }, { 4.5, 0, -6 } }
      local g = tensor.from(src, "f32", "cuda")
      assert.are.equal("cuda", g:device_name())
      assert.are.same(src, g:totable())
      assert.are.same(src, g:to("bf16"):to("cpu"):totable())
      local z = tensor.new({ 2, 2 }, "bf16", "cuda")
      assert.are.same({ { 0, 0 }, { 0, 0 } }, z:totable())
    end)
  else
    it("refuses cuda tensors without a device, saying why", function()
      local ok, err = pcall(tensor.new, { 2 }, "f32", "cuda")
      assert.is_false(ok)
      assert.matches("cuda: ", err)
      assert.is_false(pcall(function() return tensor.from({ 1 }, "f32"):to("cuda") end))
    end)
  end
end)
