-- remax.run.plot: line charts as standalone SVG text, in plain Lua (no plotting tools needed).
--
--   local svg = require("remax.run.plot").svg_lines({
--     { name = "sampled", x = { 1, 2, 3 }, y = { 0.1, 0.3, 0.2 } },
--     { name = "greedy", points = { { 1, 0.2 }, { 3, 0.25 } } },
--   }, { title = "Reward", xlabel = "step", ylabel = "reward" })
--
-- Points whose x or y is missing, NaN or infinite are skipped (the line joins its neighbours, so
-- a metric logged only on some steps still draws as a line). Equal values and single points get
-- a range around them instead of a division by zero.
local M = {}

M.palette = { "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf" }

local inf = math.huge
local function finite(v) return type(v) == "number" and v == v and v ~= inf and v ~= -inf end

function M.escape(s)
  return (tostring(s):gsub("[&<>\"']", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;",
    ['"'] = "&quot;", ["'"] = "&#39;" }))
end
local esc = M.escape

-- A series' finite points as { {x, y}, ... }, sorted by x.
local function points_of(s, i)
  local pts = {}
  if s.points then
    for _, p in ipairs(s.points) do
      if finite(p[1]) and finite(p[2]) then pts[#pts + 1] = { p[1], p[2] } end
    end
  else
    local xs, ys = s.x, s.y
    if type(ys) ~= "table" then error(("plot.svg_lines: series %d has neither points nor y"):format(i), 3) end
    local n = #ys
    for j = 1, n do
      local x = j   -- without x, points are numbered 1, 2, ...
      if xs then x = xs[j] end
      if finite(x) and finite(ys[j]) then pts[#pts + 1] = { x, ys[j] } end
    end
  end
  table.sort(pts, function(a, b) return a[1] < b[1] end)
  return pts
end

-- Widens an empty range: equal values get +-10% (or +-1 around zero).
local function widen(lo, hi)
  if lo < hi then return lo, hi end
  local d = lo == 0 and 1 or math.abs(lo) * 0.1
  return lo - d, hi + d
end

-- "Nice" ticks (1, 2, 5 x 10^k) covering [lo, hi]: returns the ticks and the widened bounds.
function M.ticks(lo, hi, target)
  lo, hi = widen(lo, hi)
  target = target or 5
  local raw = (hi - lo) / target
  local mag = 10 ^ math.floor(math.log10(raw))
  local step = mag * 10
  for _, m in ipairs({ 1, 2, 5, 10 }) do
    if m * mag >= raw then step = m * mag break end
  end
  local first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
  local out = {}
  for k = first, last do out[#out + 1] = k * step end
  return out, first * step, last * step, step
end

-- Tick label: as many decimals as the tick spacing needs, %g for very large or small values.
function M.tick_label(v, step)
  if math.abs(v) < step * 1e-6 then return "0" end
  local a = math.abs(v)
  if a >= 1e6 or (a < 1e-3) then return (("%.3g"):format(v):gsub("e%+?(-?)0*(%d)", "e%1%2")) end
  local decimals = -math.floor(math.log10(step) + 1e-9)
  if decimals <= 0 then decimals = 0 end   -- a literal 0: math.max(0, -0) is -0, "%.-0f" is invalid
  return ("%." .. decimals .. "f"):format(v)
end

local function num(v) return ("%.2f"):format(v) end

-- series: list of { name =, x = {...}, y = {...} } or { name =, points = { {x, y}, ... } },
-- optional color. opts: title, xlabel, ylabel, width (640), height (360), markers (draw dots
-- when a series has at most this many points; default 40), integer_x (x ticks on whole numbers
-- only: steps). Returns SVG text.
function M.svg_lines(series, opts)
  opts = opts or {}
  if type(series) ~= "table" then error("plot.svg_lines: expected a list of series, got " .. type(series), 2) end
  local W, H = opts.width or 640, opts.height or 360
  local L, R, T, B = 64, 16, 34, 46
  local pw, ph = W - L - R, H - T - B
  local all = {}
  local xmin, xmax, ymin, ymax = inf, -inf, inf, -inf
  for i, s in ipairs(series) do
    local pts = points_of(s, i)
    all[i] = pts
    for _, p in ipairs(pts) do
      xmin, xmax = math.min(xmin, p[1]), math.max(xmax, p[1])
      ymin, ymax = math.min(ymin, p[2]), math.max(ymax, p[2])
    end
  end
  local empty = xmin > xmax
  if empty then xmin, xmax, ymin, ymax = 0, 1, 0, 1 end
  local xt, x0, x1, xstep = M.ticks(xmin, xmax, 6)
  if opts.integer_x and xstep < 1 then   -- steps: whole numbers only
    x0, x1, xstep, xt = math.floor(xmin + 1e-9) - (xmin == xmax and 1 or 0), math.ceil(xmax - 1e-9) + (xmin == xmax and 1 or 0), 1, {}
    for v = x0, x1 do xt[#xt + 1] = v end
  end
  local yt, y0, y1, ystep = M.ticks(ymin, ymax, 5)
  local function px(x) return L + (x - x0) / (x1 - x0) * pw end
  local function py(y) return T + ph - (y - y0) / (y1 - y0) * ph end

  local o = {}
  local function add(s) o[#o + 1] = s end
  add(('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
    .. 'font-family="sans-serif" font-size="11">'):format(W, H, W, H))
  add(('<rect x="0" y="0" width="%d" height="%d" fill="white"/>'):format(W, H))
  if opts.title then
    add(('<text x="%d" y="21" font-size="14" font-weight="bold">%s</text>'):format(L, esc(opts.title)))
  end
  -- grid and tick labels
  add('<g class="grid" stroke="#e5e5e5" stroke-width="1">')
  for _, v in ipairs(yt) do add(('<line x1="%d" y1="%s" x2="%d" y2="%s"/>'):format(L, num(py(v)), L + pw, num(py(v)))) end
  for _, v in ipairs(xt) do add(('<line x1="%s" y1="%d" x2="%s" y2="%d"/>'):format(num(px(v)), T, num(px(v)), T + ph)) end
  add('</g>')
  add('<g class="axes" stroke="#333" stroke-width="1">')
  add(('<line x1="%d" y1="%d" x2="%d" y2="%d"/>'):format(L, T + ph, L + pw, T + ph))
  add(('<line x1="%d" y1="%d" x2="%d" y2="%d"/>'):format(L, T, L, T + ph))
  for _, v in ipairs(yt) do add(('<line x1="%d" y1="%s" x2="%d" y2="%s"/>'):format(L - 4, num(py(v)), L, num(py(v)))) end
  for _, v in ipairs(xt) do add(('<line x1="%s" y1="%d" x2="%s" y2="%d"/>'):format(num(px(v)), T + ph, num(px(v)), T + ph + 4)) end
  add('</g>')
  add('<g class="ticks" fill="#333">')
  for _, v in ipairs(yt) do
    add(('<text x="%d" y="%s" text-anchor="end">%s</text>'):format(L - 7, num(py(v) + 4), esc(M.tick_label(v, ystep))))
  end
  for _, v in ipairs(xt) do
    add(('<text x="%s" y="%d" text-anchor="middle">%s</text>'):format(num(px(v)), T + ph + 16, esc(M.tick_label(v, xstep))))
  end
  add('</g>')
  if opts.xlabel then
    add(('<text x="%s" y="%d" text-anchor="middle" fill="#333">%s</text>'):format(num(L + pw / 2), H - 8, esc(opts.xlabel)))
  end
  if opts.ylabel then
    add(('<text x="14" y="%s" text-anchor="middle" fill="#333" transform="rotate(-90 14 %s)">%s</text>'):format(
      num(T + ph / 2), num(T + ph / 2), esc(opts.ylabel)))
  end
  if empty then
    add(('<text x="%s" y="%s" text-anchor="middle" fill="#999">no data</text>'):format(num(L + pw / 2), num(T + ph / 2)))
  end
  -- series
  local markers = opts.markers or 40
  for i, s in ipairs(series) do
    local color = s.color or M.palette[(i - 1) % #M.palette + 1]
    local pts = all[i]
    if #pts >= 2 then
      local coords = {}
      for j, p in ipairs(pts) do coords[j] = num(px(p[1])) .. "," .. num(py(p[2])) end
      add(('<polyline class="series" data-name="%s" fill="none" stroke="%s" stroke-width="1.5" '
        .. 'stroke-linejoin="round" points="%s"/>'):format(esc(s.name or ("series " .. i)), color, table.concat(coords, " ")))
    end
    if #pts >= 1 and #pts <= markers then
      add(('<g class="markers" fill="%s">'):format(color))
      for _, p in ipairs(pts) do
        add(('<circle cx="%s" cy="%s" r="%s"/>'):format(num(px(p[1])), num(py(p[2])), #pts == 1 and "3.5" or "2.5"))
      end
      add('</g>')
    end
  end
  -- legend: one row in the header band, right-aligned, so it never hides data
  local items, x = {}, W - R
  for i = #series, 1, -1 do
    local name = tostring(series[i].name or ("series " .. i))
    local w = 24 + #name * 6.2
    x = x - w
    items[i] = { name = name, x = x, color = series[i].color or M.palette[(i - 1) % #M.palette + 1] }
    x = x - 12
  end
  if #series > 0 then
    add('<g class="legend">')
    for i = 1, #series do
      local it = items[i]
      add(('<line x1="%s" y1="16" x2="%s" y2="16" stroke="%s" stroke-width="2"/>'):format(num(it.x), num(it.x + 18), it.color))
      add(('<text x="%s" y="20">%s</text>'):format(num(it.x + 23), esc(it.name)))
    end
    add('</g>')
  end
  add('</svg>\n')
  return table.concat(o, "\n")
end

-- Over-optimisation of a learned reward (recipes/rlhf/chain.lua, the run's report): score and
-- truth are series {x = steps, y = values} (the reward model's score and the hidden true
-- preference per step). Over the steps both have (finite values), each is smoothed by a trailing
-- running mean of opts.window points (default 4); the truth's peak is the first step of its
-- largest smoothed value among the steps with a full window (from the window-th on). Returns { steps, score_smooth, truth_smooth, truth_peak_step,
-- truth_peak, score_at_peak, score_after_peak (at the last step), truth_after_peak,
-- overoptimised } where overoptimised is true when the peak is before the last step and the
-- smoothed score still rose after it (the score keeps rising, the truth stopped or fell).
function M.overoptimisation(score, truth, opts)
  opts = opts or {}
  local window = opts.window or 4
  local at = {}
  for i, x in ipairs(score.x or {}) do
    if finite(x) and finite(score.y[i]) then at[x] = score.y[i] end
  end
  local steps, sv, tv = {}, {}, {}
  local order = {}
  for i, x in ipairs(truth.x or {}) do
    if finite(x) and finite(truth.y[i]) and at[x] ~= nil then order[#order + 1] = { x, truth.y[i] } end
  end
  table.sort(order, function(a, b) return a[1] < b[1] end)
  if #order == 0 then error("overoptimisation: the score and the truth share no step with finite values", 2) end
  for i, p in ipairs(order) do steps[i], sv[i], tv[i] = p[1], at[p[1]], p[2] end
  local function smooth(v)
    local out, sum = {}, 0
    for i = 1, #v do
      sum = sum + v[i]
      if i > window then sum = sum - v[i - window] end
      out[i] = sum / math.min(i, window)
    end
    return out
  end
  local ss, ts = smooth(sv), smooth(tv)
  -- the peak among the steps with a full window (a lone first value is not a trend)
  local first = math.min(window, #ts)
  local peak = first
  for i = first + 1, #ts do if ts[i] > ts[peak] + 1e-12 then peak = i end end
  local last = #ts
  return { steps = steps, score_smooth = ss, truth_smooth = ts, truth_peak_step = steps[peak], truth_peak = ts[peak],
    score_at_peak = ss[peak], score_after_peak = ss[last], truth_after_peak = ts[last],
    overoptimised = peak < last and ss[last] > ss[peak] }
end

-- The per-reward-function series of a run's metrics rows: every "reward/<name>" key (the mean
-- of that function's score over the step's sampled completions) as {key =, name =}, sorted by
-- name (the run's report draws them on one chart: a learned reward beside a measured truth).
function M.reward_keys(rows)
  local seen, keys = {}, {}
  for _, row in ipairs(rows or {}) do
    for k, v in pairs(row) do
      if type(k) == "string" and type(v) == "number" and not seen[k] and k:match("^reward/[^/]+$") then
        seen[k] = true
        keys[#keys + 1] = k
      end
    end
  end
  table.sort(keys)
  local out = {}
  for i, k in ipairs(keys) do out[i] = { key = k, name = k:sub(8) } end
  return out
end

return M
