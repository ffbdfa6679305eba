local plot = require("remax.run.plot")

-- A loose XML check: every tag closes in order, attribute quotes balance. Returns the elements
-- as { name =, attrs = text } in document order.
local function parse(svg)
  local stack, elements = {}, {}
  local pos = 1
  while true do
    local s, e, close, name, attrs, selfclose = svg:find("<(/?)([%w:]+)([^<>]-)(/?)>", pos)
    if not s then break end
    assert.is_nil(svg:sub(pos, s - 1):find("[<>]"), "stray angle bracket before " .. name)
    local _, quotes = attrs:gsub('"', "")
    assert.are.equal(0, quotes % 2, "unbalanced quotes in <" .. name .. ">")
    if close == "/" then
      assert.are.equal(table.remove(stack), name, "closing tag out of order")
    else
      elements[#elements + 1] = { name = name, attrs = attrs }
      if selfclose ~= "/" then stack[#stack + 1] = name end
    end
    pos = e + 1
  end
  assert.is_nil(svg:sub(pos):find("[<>]"), "stray angle bracket at the end")
  assert.are.same({}, stack, "unclosed tags")
  assert.are.equal("svg", elements[1].name)
  return elements
end

local function of(elements, name)
  local out = {}
  for _, el in ipairs(elements) do if el.name == name then out[#out + 1] = el end end
  return out
end

local function polyline_points(el)
  local pts = {}
  for x, y in el.attrs:match('points="([^"]*)"'):gmatch("([-%d.]+),([-%d.]+)") do
    pts[#pts + 1] = { tonumber(x), tonumber(y) }
  end
  return pts
end

describe("plot.svg_lines", function()
  it("draws one polyline per series with every finite point, and a legend", function()
    local svg = plot.svg_lines({
      { name = "sampled", x = { 1, 2, 3, 4, 5 }, y = { 0.1, 0.4, 0.2, 0.5, 0.3 } },
      { name = "greedy", points = { { 1, 0.2 }, { 3, 0.3 }, { 5, 0.35 } } },
    }, { title = "Reward", xlabel = "step", ylabel = "reward" })
    local els = parse(svg)
    local lines = of(els, "polyline")
    assert.are.equal(2, #lines)
    assert.are.equal(5, #polyline_points(lines[1]))
    assert.are.equal(3, #polyline_points(lines[2]))
    assert.truthy(svg:find(">sampled<", 1, true))
    assert.truthy(svg:find(">greedy<", 1, true))
    assert.truthy(svg:find(">Reward<", 1, true))
    assert.truthy(svg:find(">step<", 1, true))
    -- x grows to the right; a larger y is drawn higher (smaller pixel y)
    local p = polyline_points(lines[1])
    for i = 2, #p do assert.is_true(p[i][1] > p[i - 1][1]) end
    assert.is_true(p[2][2] < p[1][2])
    -- every point lies inside the canvas
    for _, q in ipairs(p) do assert.is_true(q[1] >= 0 and q[1] <= 640 and q[2] >= 0 and q[2] <= 360) end
  end)

  it("skips NaN, infinite and missing points", function()
    local svg = plot.svg_lines({
      { name = "loss", x = { 1, 2, 3, 4, 5, 6 }, y = { 1.0, 0 / 0, 0.5, math.huge, 0.25, -math.huge } },
      { name = "holes", x = { 1, 2, nil, 4 }, y = { 1, 2, 3, 4 } },
    })
    local lines = of(parse(svg), "polyline")
    assert.are.equal(3, #polyline_points(lines[1]))
    assert.are.equal(3, #polyline_points(lines[2]))
    assert.is_nil(svg:lower():find("nan"))
    assert.is_nil(svg:lower():find("inf"))
  end)

  it("draws a single point as a marker and scales equal values around them", function()
    local svg = plot.svg_lines({ { name = "eval", x = { 7 }, y = { 0.5 } } })
    local els = parse(svg)
    assert.are.equal(0, #of(els, "polyline"))
    local circles = of(els, "circle")
    assert.are.equal(1, #circles)
    local cx, cy = circles[1].attrs:match('cx="([-%d.]+)" cy="([-%d.]+)"')
    -- in the middle of the plot area, not at an edge or off the canvas
    assert.is_true(tonumber(cx) > 100 and tonumber(cx) < 600)
    assert.is_true(tonumber(cy) > 60 and tonumber(cy) < 300)

    local flat = plot.svg_lines({ { name = "flat", x = { 1, 2, 3 }, y = { 2, 2, 2 } } })
    local p = polyline_points(of(parse(flat), "polyline")[1])
    assert.are.equal(p[1][2], p[3][2])
    assert.is_true(p[1][2] > 60 and p[1][2] < 300)
    assert.is_nil(flat:lower():find("nan"))
  end)

  it("handles series without any finite point", function()
    local svg = plot.svg_lines({ { name = "nothing", x = { 1, 2 }, y = { 0 / 0, 0 / 0 } } })
    local els = parse(svg)
    assert.are.equal(0, #of(els, "polyline"))
    assert.truthy(svg:find("no data", 1, true))
  end)

  it("escapes names and titles", function()
    local svg = plot.svg_lines({ { name = "a<b & \"c\"", y = { 1, 2 } } }, { title = "<x>" })
    parse(svg)
    assert.truthy(svg:find("a&lt;b &amp; &quot;c&quot;", 1, true))
    assert.truthy(svg:find("&lt;x&gt;", 1, true))
  end)

  it("chooses round tick values covering the data", function()
    local ticks, lo, hi, step = plot.ticks(0.13, 0.87, 5)
    assert.is_true(lo <= 0.13 and hi >= 0.87)
    assert.are.equal(0.2, step)
    for i = 2, #ticks do assert.is_true(math.abs(ticks[i] - ticks[i - 1] - step) < 1e-12) end
    local t2, lo2, hi2 = plot.ticks(5, 5)
    assert.is_true(lo2 < 5 and hi2 > 5 and #t2 >= 2)
    assert.are.equal("0.4", plot.tick_label(0.4, 0.2))
    assert.are.equal("200", plot.tick_label(200, 50))
    assert.are.equal("0", plot.tick_label(1e-17, 0.1))
  end)
end)
