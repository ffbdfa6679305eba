-- remax.tasks.gsm8k_synth: seeded, procedurally generated GSM8K-style word problems.
-- Each row is {question=, answer=, steps=, template=, style=}: `answer` is a solution ending in
-- "#### N" (as in GSM8K), `steps` the structured arithmetic behind it ({op=, args=, result=} with
-- op one of + - * / and % meaning args[1] * args[2] / 100), so rows go through
-- remax.data.from_rows unchanged and a test can recheck every step.
--
-- Solution styles (opts.style): "sentences" (a worded line per step, the default), "equations"
-- (one "a op b = c" line per step), "direct" (only "#### N"), or a mix such as
-- "direct:0.65,equations:0.35", drawn per problem from a stream of its own, so the questions of a
-- seed are the same whatever the style.
--
-- The problem at (seed, index, split) is always the same. A problem's split is decided by a hash of
-- its question text, and generation retries until the split matches, so train and test never share
-- a question (for any seeds).
local data = require("remax.formats.data")

local M = {}

M.TEST_SHARE = 4   -- one question text in 4 belongs to the test split

local PEOPLE = {
  { "Tom", "he", "his" }, { "Maria", "she", "her" }, { "Aisha", "she", "her" }, { "Kenji", "he", "his" },
  { "Lena", "she", "her" }, { "Omar", "he", "his" }, { "Priya", "she", "her" }, { "Diego", "he", "his" },
  { "Chloe", "she", "her" }, { "Samuel", "he", "his" }, { "Fatima", "she", "her" }, { "Lucas", "he", "his" },
  { "Mei", "she", "her" }, { "Jamal", "he", "his" }, { "Sofia", "she", "her" }, { "Ivan", "he", "his" },
  { "Grace", "she", "her" }, { "Mateo", "he", "his" }, { "Zara", "she", "her" }, { "Noah", "he", "his" },
  { "Amara", "she", "her" }, { "Felix", "he", "his" }, { "Hana", "she", "her" }, { "Ravi", "he", "his" },
  { "Elena", "she", "her" }, { "Kwame", "he", "his" }, { "Ingrid", "she", "her" }, { "Pedro", "he", "his" },
  { "Yuki", "she", "her" }, { "Ben", "he", "his" }, { "Nadia", "she", "her" }, { "Oscar", "he", "his" },
}

-- {singular, plural}
local GOODS = {
  { "apple", "apples" }, { "notebook", "notebooks" }, { "pencil", "pencils" }, { "muffin", "muffins" },
  { "toy car", "toy cars" }, { "book", "books" }, { "shirt", "shirts" }, { "bag of rice", "bags of rice" },
  { "movie ticket", "movie tickets" }, { "plant", "plants" }, { "candle", "candles" }, { "mango", "mangoes" },
  { "sandwich", "sandwiches" }, { "comic book", "comic books" }, { "pair of socks", "pairs of socks" },
  { "jar of honey", "jars of honey" }, { "bottle of juice", "bottles of juice" }, { "puzzle", "puzzles" },
  { "flower pot", "flower pots" }, { "box of crayons", "boxes of crayons" }, { "cupcake", "cupcakes" },
}

local SHARED = { "cookies", "stickers", "marbles", "strawberries", "candies", "seashells", "beads", "cards" }
local CONTAINERS = { "boxes", "bags", "jars", "packs", "baskets", "tins" }
local GROUPS = { "friends", "classmates", "cousins", "teammates", "neighbors" }

-- {worker phrase, product plural, time unit}
local MAKERS = {
  { "a baker", "loaves of bread", "hour" }, { "a machine", "bolts", "minute" },
  { "a printer", "pages", "minute" }, { "a potter", "bowls", "hour" },
  { "a tailor", "shirts", "day" }, { "a factory line", "bottles", "minute" },
  { "a carpenter", "chairs", "day" }, { "a bee farm", "jars of honey", "day" },
}
local PERIOD = { minute = "hour", hour = "day", day = "week" }
local PERIOD_UNITS = { minute = "minutes", hour = "hours", day = "days" }
local PER_PERIOD = { minute = 60, hour = 12, day = 7 }   -- most work units in one period

local VEHICLES = {
  { "drives", "miles", "car" }, { "cycles", "kilometers", "bike" }, { "sails", "miles", "boat" },
  { "rides a train", "kilometers", "train" }, { "walks", "kilometers", "walk" },
}

local SAVINGS = {
  "saves $%s each week from %s allowance", "earns $%s each week mowing lawns",
  "puts $%s into %s piggy bank every week", "earns $%s each week walking dogs",
}
local PURCHASES = { "a bike", "a skateboard", "a pair of shoes", "a concert ticket", "a guitar", "a tablet" }
local GAMES = { "video games", "board games", "books", "model kits", "art sets" }

local SALE = { "jacket", "lamp", "backpack", "blender", "pair of boots", "desk chair", "watch", "tent" }

---------------------------------------------------------------------------- arithmetic record

local OPS = {
  ["+"] = function(a) local s = 0; for _, v in ipairs(a) do s = s + v end; return s end,
  ["-"] = function(a) local s = a[1]; for i = 2, #a do s = s - a[i] end; return s end,
  ["*"] = function(a) local s = 1; for _, v in ipairs(a) do s = s * v end; return s end,
  ["/"] = function(a) return a[1] / a[2] end,
  ["%"] = function(a) return a[1] * a[2] / 100 end,
}

local function num(v) return string.format("%d", v) end

function M.expression(op, args, result)
  local strs = {}
  for i, v in ipairs(args) do strs[i] = num(v) end
  if op == "%" then return strs[1] .. " * " .. strs[2] .. " / 100 = " .. num(result) end
  return table.concat(strs, " " .. op .. " ") .. " = " .. num(result)
end

-- "{name} pays {e} dollars." with vars; {He}/{His} are capitalised pronouns.
local function fill(fmt, vars)
  return (fmt:gsub("{(%w+)}", function(k)
    local v = vars[k]
    if v == nil then error("gsm8k_synth: template key {" .. k .. "} has no value", 2) end
    return type(v) == "number" and num(v) or v
  end))
end

local Work = {}
Work.__index = Work

local function new_work(r, person)
  local w = setmetatable({ r = r, steps = {}, lines = {}, ok = true, vars = {} }, Work)
  if person then
    w.vars.name, w.vars.he, w.vars.his = person[1], person[2], person[3]
    w.vars.He = person[2]:sub(1, 1):upper() .. person[2]:sub(2)
    w.vars.His = person[3]:sub(1, 1):upper() .. person[3]:sub(2)
  end
  return w
end

-- Compute one step, record it, and add the solution sentence with {e} = "a op b = result".
function Work:calc(op, args, sentence)
  local result = OPS[op](args)
  if result ~= math.floor(result) or result < 0 then self.ok = false end
  self.steps[#self.steps + 1] = { op = op, args = args, result = result }
  self.vars.e = M.expression(op, args, result)
  self.lines[#self.lines + 1] = fill(sentence, self.vars)
  return result
end

function Work:set(t) for k, v in pairs(t) do self.vars[k] = v end end
function Work:text(fmt) return fill(fmt, self.vars) end

-- Divisors of n in [lo, hi].
local function divisors(n, lo, hi)
  local out = {}
  for d = lo, math.min(hi, n) do if n % d == 0 then out[#out + 1] = d end end
  return out
end

---------------------------------------------------------------------------- templates
-- Each builds a problem with exactly k steps: build(w, k, N) -> question or nil (constraints failed).

local templates = {}

templates.shopping = { min = 1, max = 10, build = function(w, k, N)
  local r = w.r
  local options = {}
  if k == 1 then options[#options + 1] = { 1, false } end
  if k == 2 then options[#options + 1] = { 1, true } end
  if k >= 3 then options[#options + 1] = { k - 1, false } end
  if k >= 4 then options[#options + 1] = { k - 2, true } end
  local choice = r:pick(options)
  local kinds, change = choice[1], choice[2]
  local goods = r:shuffle({ unpack(GOODS) })
  local buys, costs = {}, {}
  for i = 1, kinds do
    local g = goods[i]
    local q, p = r:int(2, math.min(N, 12)), r:int(1, N)
    buys[i] = ("%d %s at $%d each"):format(q, g[2], p)
    w:set({ q = q, p = p, items = g[2] })
    local fmt = kinds == 1 and r:pick({ "{name} pays {e} dollars for the {items}.", "The {items} cost {e} dollars." })
      or r:pick({ "The {items} cost {e} dollars.", "{He} spends {e} dollars on {items}." })
    costs[i] = w:calc("*", { q, p }, fmt)
  end
  local list = buys[1]
  if kinds > 1 then list = table.concat(buys, ", ", 1, kinds - 1) .. " and " .. buys[kinds] end
  w:set({ list = list, store = r:pick({ "the market", "a bookstore", "the mall", "a corner shop", "a fair" }) })
  local total = costs[1]
  if kinds > 1 then total = w:calc("+", costs, r:pick({ "In total {he} spends {e} dollars.", "Altogether that is {e} dollars." })) end
  local q = w:text(r:pick({ "{name} goes to {store} and buys {list}.", "At {store}, {name} buys {list}." }))
  if change then
    local bill
    for _, b in ipairs({ 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000 }) do
      if b > total then bill = b; break end
    end
    bill = bill or (math.floor(total / 1000) + 1) * 1000
    w:set({ bill = bill })
    w:calc("-", { bill, total }, "{His} change is {e} dollars.")
    return q .. w:text(" {He} pays with a ${bill} bill. How much change does {he} get?")
  end
  return q .. w:text(r:pick({ " How much does {name} spend?", " How many dollars does {he} pay in total?" }))
end }

templates.production = { min = 1, max = 4, build = function(w, k, N)
  local r = w.r
  local m = r:pick(MAKERS)
  local unit = m[3]
  local rate, per = r:int(2, N), r:int(2, math.min(N, PER_PERIOD[unit]))
  w:set({ who = m[1], the = m[1]:gsub("^an? ", "the "), goods = m[2], unit = unit, rate = rate, per = per, units = PERIOD_UNITS[unit],
          period = PERIOD[unit] })
  local q = w:text("{who} makes {rate} {goods} every {unit} and works {per} {units} each {period}.")
  q = q:sub(1, 1):upper() .. q:sub(2)
  local made = w:calc("*", { rate, per }, "Each {period} {the} makes {e} {goods}.")
  if k == 1 then return q .. w:text(" How many {goods} does {the} make in one {period}?") end
  local periods = r:int(2, math.min(N, 10))
  w:set({ n = periods })
  made = w:calc("*", { made, periods }, "In {n} {period}s {the} makes {e} {goods}.")
  if k == 2 then return q .. w:text(" How many {goods} does {the} make in {n} {period}s?") end
  local price = r:int(1, N)
  w:set({ price = price })
  local money = w:calc("*", { made, price }, "Selling them brings in {e} dollars.")
  if k == 3 then
    return q .. w:text(" Each of the {goods} sells for ${price}. How much money do {n} {period}s of work bring in?")
  end
  if money < 2 then return nil end
  local cost = r:int(1, math.min(N, money - 1))
  w:set({ cost = cost })
  w:calc("-", { money, cost }, "After paying ${cost} for materials, the profit is {e} dollars.")
  return q .. w:text(" Each of the {goods} sells for ${price}, and the materials for {n} {period}s cost ${cost}." ..
    " What is the profit for {n} {period}s?")
end }

templates.travel = { min = 1, max = 4, build = function(w, k, N)
  local r = w.r
  local v = r:pick(VEHICLES)
  local s1, h1 = r:int(2, N), r:int(2, math.min(N, 9))
  w:set({ moves = v[1], dist = v[2], s1 = s1, h1 = h1 })
  local q = w:text("{name} {moves} at {s1} {dist} per hour for {h1} hours")
  local d1 = w:calc("*", { s1, h1 }, "At {s1} {dist} per hour for {h1} hours, {he} covers {e} {dist}.")
  local total = d1
  if k == 1 then return q .. w:text(". How many {dist} does {he} travel?") end
  if k == 2 then
    local days = r:int(2, math.min(N, 7))
    w:set({ days = days })
    w:calc("*", { d1, days }, "Over {days} days that is {e} {dist}.")
    return q .. w:text(" every day. How many {dist} does {he} travel in {days} days?")
  end
  local s2, h2 = r:int(2, N), r:int(2, math.min(N, 9))
  w:set({ s2 = s2, h2 = h2 })
  local d2 = w:calc("*", { s2, h2 }, "Then {he} goes {s2} {dist} per hour for {h2} hours, which is {e} {dist}.")
  total = w:calc("+", { d1, d2 }, "In total {he} travels {e} {dist}.")
  q = q .. w:text(", then at {s2} {dist} per hour for {h2} hours.")
  if k == 3 then return q .. w:text(" How many {dist} does {he} travel in total?") end
  local per = divisors(total, 2, N)
  if #per == 0 then return nil end
  local stop = r:pick(per)
  w:set({ stop = stop })
  w:calc("/", { total, stop }, "Stopping every {stop} {dist} means {e} stops.")
  return q .. w:text(" {He} stops for a break every {stop} {dist}, including at the end. How many breaks does {he} take?")
end }

templates.sharing = { min = 1, max = 3, build = function(w, k, N)
  local r = w.r
  local thing, group = r:pick(SHARED), r:pick(GROUPS)
  local f = r:int(2, math.min(N, 10))
  w:set({ thing = thing, group = group, f = f })
  if k == 1 then
    local total = f * r:int(1, math.max(1, math.floor(N / f)))
    w:set({ total = total })
    w:calc("/", { total, f }, "Each of the {f} {group} gets {e} {thing}.")
    return w:text("{name} has {total} {thing} and shares them equally among {f} {group}. How many {thing} does each get?")
  end
  local total, q
  if k == 2 then
    total = r:int(f + 1, math.max(f + 1, N))
    w:set({ total = total })
    q = w:text("{name} has {total} {thing}.")
  else
    local n, m = r:int(2, math.min(N, 12)), r:int(2, N)
    w:set({ n = n, m = m, box = r:pick(CONTAINERS) })
    total = w:calc("*", { n, m }, "{name} starts with {e} {thing}.")
    q = w:text("{name} has {n} {box} with {m} {thing} in each.")
  end
  -- keep g so that the rest divides evenly among the f people
  local g = total % f
  if g == 0 then g = f end
  g = g + f * r:int(0, math.max(0, math.floor((math.min(N, total - 1) - g) / f)))
  if g >= total or g > N then return nil end
  w:set({ g = g })
  local rest = w:calc("-", { total, g }, "After giving away {g}, {he} has {e} {thing} left.")
  w:calc("/", { rest, f }, "Each of the {f} {group} gets {e} {thing}.")
  return q .. w:text(" {He} gives {g} of them to {his} teacher and shares the rest equally among {f} {group}." ..
    " How many {thing} does each of them get?")
end }

templates.ages = { min = 1, max = 3, build = function(w, k, N)
  local r = w.r
  local p = r:shuffle({ unpack(PEOPLE) })
  local x, m = r:int(2, math.min(N, 30)), r:int(2, math.min(N, 4))
  w:set({ a = p[1][1], b = p[2][1], c = p[3][1], x = x, m = m })
  local q = w:text("{a} is {x} years old. {b} is {m} times as old as {a}.")
  local b = w:calc("*", { x, m }, "{b} is {e} years old.")
  if k == 1 then return q .. w:text(" How old is {b}?") end
  if b < 2 then return nil end
  local d = r:int(1, math.min(N, math.max(1, math.floor(b / 2))))
  w:set({ d = d })
  local c = w:calc("-", { b, d }, "{c} is {e} years old.")
  q = q .. w:text(" {c} is {d} years younger than {b}.")
  if k == 2 then return q .. w:text(" How old is {c}?") end
  if r:int(2) == 1 then
    local y = r:int(1, math.min(N, 20))
    w:set({ y = y })
    w:calc("+", { c, y }, "In {y} years {c} will be {e} years old.")
    return q .. w:text(" How old will {c} be in {y} years?")
  end
  w:calc("+", { x, b, c }, "Together they are {e} years old.")
  return q .. w:text(" What is the sum of the ages of {a}, {b} and {c}?")
end }

templates.savings = { min = 1, max = 4, build = function(w, k, N)
  local r = w.r
  local s, weeks = r:int(1, N), r:int(2, math.min(N, 20))
  w:set({ s = s, weeks = weeks, earns = r:pick(SAVINGS):format(num(s), w.vars.his) })
  local q = w:text("{name} {earns}.")
  local saved = w:calc("*", { s, weeks }, "In {weeks} weeks {he} saves {e} dollars.")
  if k == 1 then return q .. w:text(" How much money does {he} have after {weeks} weeks?") end
  local a = r:int(1, N)
  w:set({ a = a })
  local total = w:calc("+", { a, saved }, "With the ${a} {he} already had, {he} has {e} dollars.")
  q = w:text("{name} has ${a}. {He} {earns}.")
  if k == 2 then return q .. w:text(" How much money does {he} have after {weeks} weeks?") end
  w:set({ thing = r:pick(PURCHASES) })
  if k == 3 then
    local c = r:int(1, math.min(N, total - 1))
    w:set({ c = c })
    w:calc("-", { total, c }, "After buying {thing} for ${c}, {he} has {e} dollars left.")
    return q .. w:text(" After {weeks} weeks {he} buys {thing} for ${c}. How much money does {he} have left?")
  end
  local price = r:int(2, math.min(N, 60))
  local c = total % price
  if c == 0 then c = price end
  c = c + price * r:int(0, math.max(0, math.floor((math.min(N, total - 1) - c) / price)))
  if c >= total or c > N then return nil end
  w:set({ c = c, price = price, games = r:pick(GAMES) })
  local left = w:calc("-", { total, c }, "After buying {thing} for ${c}, {he} has {e} dollars left.")
  w:calc("/", { left, price }, "At ${price} each, {he} can buy {e} {games}.")
  return q .. w:text(" After {weeks} weeks {he} buys {thing} for ${c} and spends the rest on {games} that cost" ..
    " ${price} each. How many {games} does {he} buy?")
end }

local PERCENTS = { 5, 10, 15, 20, 25, 30, 40, 50, 60, 75, 80 }

local function gcd(a, b) while b ~= 0 do a, b = b, a % b end return a end

-- A whole number in [1, N] (as a multiple of `unit` times a factor) for which pct% is exact.
local function percent_base(r, pct, N)
  local unit = 100 / gcd(pct, 100)
  local most = math.floor(N / unit)
  if most < 1 then return nil end
  return unit * r:int(most)
end

templates.percent = { min = 1, max = 3, build = function(w, k, N)
  local r = w.r
  local pct = r:pick(PERCENTS)
  if r:int(3) == 1 and k <= 2 then
    -- a share of a group
    local total = percent_base(r, pct, N)
    if not total then return nil end
    w:set({ total = total, pct = pct })
    local part = w:calc("%", { total, pct }, "{pct}% of {total} is {e} students.")
    if k == 1 then
      return w:text("A school has {total} students, and {pct}% of them walk to school. How many students walk to school?")
    end
    w:calc("-", { total, part }, "So {e} students do not walk.")
    return w:text("A school has {total} students, and {pct}% of them walk to school. How many students do not walk?")
  end
  local price = percent_base(r, pct, N)
  if not price then return nil end
  w:set({ price = price, pct = pct, thing = r:pick(SALE) })
  local q = w:text("A {thing} costs ${price}. It is on sale for {pct}% off.")
  local off = w:calc("%", { price, pct }, "The discount is {e} dollars.")
  if k == 1 then return q .. " How many dollars is the discount?" end
  local sale = w:calc("-", { price, off }, "The sale price is {e} dollars.")
  if k == 2 then return q .. w:text(" What is the sale price of the {thing}?") end
  local n = r:int(2, math.min(N, 10))
  w:set({ n = n })
  w:calc("*", { sale, n }, "For {n} of them {he} pays {e} dollars.")
  return q .. w:text(" {name} buys {n} of them on sale. How much does {he} pay?")
end }

templates.bakery = { min = 3, max = 5, build = function(w, k, N)
  local r = w.r
  local pct = r:pick(PERCENTS)
  local unit = 100 / gcd(pct, 100)
  local b, c
  for _ = 1, 20 do
    b, c = r:int(2, math.min(N, 12)), r:int(2, N)
    if (b * c) % unit == 0 then break end
    b = nil
  end
  if not b then return nil end
  w:set({ b = b, c = c, pct = pct, treat = r:pick({ "cookies", "muffins", "rolls", "pretzels", "tarts" }) })
  local q = w:text("{name} bakes {b} trays of {treat} with {c} {treat} on each tray. {He} sells {pct}% of them at the morning market.")
  local total = w:calc("*", { b, c }, "{name} bakes {e} {treat}.")
  local sold = w:calc("%", { total, pct }, "In the morning {he} sells {e} {treat}.")
  local rest = w:calc("-", { total, sold }, "That leaves {e} {treat}.")
  if k == 3 then return q .. w:text(" How many {treat} are left?") end
  local sizes = divisors(rest, 2, math.min(N, 12))
  if #sizes == 0 then return nil end
  local g = r:pick(sizes)
  w:set({ g = g })
  local bags = w:calc("/", { rest, g }, "Packed {g} to a bag, that is {e} bags.")
  q = q .. w:text(" {He} packs the rest into bags of {g}.")
  if k == 4 then return q .. " How many bags does " .. w.vars.he .. " fill?" end
  local p = r:int(1, N)
  w:set({ p = p })
  w:calc("*", { bags, p }, "Selling each bag for ${p} brings in {e} dollars.")
  return q .. w:text(" {He} sells each bag for ${p}. How much money do the bags bring in?")
end }

M.templates = templates
local TEMPLATE_NAMES = {}
for name in pairs(templates) do TEMPLATE_NAMES[#TEMPLATE_NAMES + 1] = name end
table.sort(TEMPLATE_NAMES)   -- pairs order is not stable; choices must be

---------------------------------------------------------------------------- generation

-- "train" or "test" for a question text.
function M.split_of(question)
  return data.hash(question) % M.TEST_SHARE == 0 and "test" or "train"
end

M.STYLES = { sentences = true, equations = true, direct = true }

-- "equations" -> {{"equations", 1}}; "direct:0.65,equations:0.35" -> cumulative weights.
function M.parse_style(spec)
  if type(spec) ~= "string" or spec == "" then
    error(("gsm8k_synth: style must be a string such as \"sentences\" or \"direct:0.6,equations:0.4\", got %s")
      :format(tostring(spec)), 3)
  end
  local mix, total = {}, 0
  for part in spec:gmatch("[^,]+") do
    local name, w = part:match("^%s*([%a_]+)%s*:%s*([%d%.eE%-+]+)%s*$")
    if not name then name, w = part:match("^%s*([%a_]+)%s*$"), "1" end
    w = tonumber(w)
    if not name or not M.STYLES[name] or not w or w < 0 or w ~= w then
      error(("gsm8k_synth: style '%s': '%s' is not style[:weight] with a style of sentences, equations, direct")
        :format(spec, part), 3)
    end
    total = total + w
    mix[#mix + 1] = { name, total }
  end
  if total <= 0 then error(("gsm8k_synth: style '%s': the weights add up to 0"):format(spec), 3) end
  for _, m in ipairs(mix) do m[2] = m[2] / total end
  return mix
end

local function options(opts)
  opts = opts or {}
  local steps = opts.steps or { 1, 4 }
  if type(steps) == "number" then steps = { steps, steps } end
  local lo, hi = steps[1], steps[2]
  if type(lo) ~= "number" or type(hi) ~= "number" or lo < 1 or hi < lo or hi > 10 or lo ~= math.floor(lo) or hi ~= math.floor(hi) then
    error(("gsm8k_synth: steps = {%s, %s}: need integers 1 <= min <= max <= 10"):format(tostring(lo), tostring(hi)), 3)
  end
  local N = opts.max_number or 100
  if type(N) ~= "number" or N < 10 or N ~= math.floor(N) then
    error("gsm8k_synth: max_number must be an integer >= 10, got " .. tostring(N), 3)
  end
  local split = opts.split or "train"
  if split ~= "train" and split ~= "test" then
    error("gsm8k_synth: split must be 'train' or 'test', got " .. tostring(split), 3)
  end
  local seed = opts.seed or 0
  if type(seed) ~= "number" or seed < 0 or seed ~= math.floor(seed) or seed >= 2 ^ 53 then
    error("gsm8k_synth: seed must be an integer in [0, 2^53), got " .. tostring(seed), 3)
  end
  return { lo = lo, hi = hi, N = N, split = split, seed = seed, style = M.parse_style(opts.style or "sentences") }
end

local MAX_ATTEMPTS = 65536

local function attempt(o, index, a)
  local r = data.rng(o.seed, index * MAX_ATTEMPTS + a)
  local k = r:int(o.lo, o.hi)
  local fits = {}
  for _, name in ipairs(TEMPLATE_NAMES) do
    local t = templates[name]
    if k >= t.min and k <= t.max then fits[#fits + 1] = name end
  end
  local name = r:pick(fits)
  local w = new_work(r, r:pick(PEOPLE))
  local question = templates[name].build(w, k, o.N)
  if not question or not w.ok or #w.steps ~= k then return nil end
  return { question = question, steps = w.steps, lines = w.lines, template = name }
end

-- The solution text of a problem in a style.
function M.solution(style, steps, lines)
  local final = "#### " .. num(steps[#steps].result)
  if style == "direct" then return final end
  if style == "equations" then
    local eq = {}
    for i, st in ipairs(steps) do eq[i] = M.expression(st.op, st.args, st.result) end
    lines = eq
  end
  return table.concat(lines, "\n") .. "\n" .. final
end

-- The style of problem `index`: its own random stream, independent of the question's draws.
local function style_of(o, index)
  if #o.style == 1 then return o.style[1][1] end
  local u = data.rng(o.seed, "style:" .. o.split .. ":" .. index):u32() / 4294967296
  for _, m in ipairs(o.style) do if u < m[2] then return m[1] end end
  return o.style[#o.style][1]
end

-- The problem number `index` (>= 1) of a split: opts = {seed=, split=, steps=, max_number=}.
function M.problem(index, opts)
  local o = options(opts)
  if type(index) ~= "number" or index < 1 or index ~= math.floor(index) or index >= 2 ^ 36 then
    error("gsm8k_synth: index must be an integer >= 1, got " .. tostring(index), 2)
  end
  for a = 0, MAX_ATTEMPTS - 1 do
    local row = attempt(o, index, a)
    if row and M.split_of(row.question) == o.split then
      row.style = style_of(o, index)
      row.answer = M.solution(row.style, row.steps, row.lines)
      row.lines = nil
      return row
    end
  end
  error(("gsm8k_synth: no %s problem found for index %d after %d attempts"):format(o.split, index, MAX_ATTEMPTS), 2)
end

-- n problems (indices first .. first + n - 1, opts.first defaults to 1).
function M.generate(n, opts)
  options(opts)
  local rows, first = {}, (opts and opts.first) or 1
  for i = 1, n do rows[i] = M.problem(first + i - 1, opts) end
  return rows
end

-- A remax.data dataset of n problems.
function M.dataset(n, opts)
  return data.from_rows(M.generate(n, opts), { name = "gsm8k_synth" })
end

return M
