-- bench/trl_report.lua: the tables, ratios and chart of bench/trl_peer.sh from the runs in a folder
-- (remax's metrics.jsonl of remax-remax/ and remax-grpo/, bench/trl_peer.py's trl-*.json, the load
-- log). Rerunning it redraws without training.
--   ./remax run bench/trl_report.lua [--dir runs/trl_peer] [--eval_size 500] [--tools_eval_size 300]
local cjson = require("cjson")
local plot = require("remax.run.plot")
local common = dofile(arg[0]:match("^(.-)[^/]*$") .. "common.lua")
local opts = common.options({ dir = "runs/trl_peer", eval_size = 500, tools_eval_size = 300 }, arg)
local dir = opts.dir

local function lines(path)
  local f = io.open(path)
  if not f then return nil end
  local out = {}
  for line in f:lines() do out[#out + 1] = line end
  f:close()
  return out
end

local function mean(t, key)
  local s, n = 0, 0
  for _, v in ipairs(t) do if v[key] then s, n = s + v[key], n + 1 end end
  return n > 0 and s / n or 0
end

local function median(t, key)
  local v = {}
  for _, r in ipairs(t) do v[#v + 1] = r[key] end
  table.sort(v)
  if #v == 0 then return 0 end
  return #v % 2 == 1 and v[(#v + 1) / 2] or (v[#v / 2] + v[#v / 2 + 1]) / 2
end

-- the load average (1 min) over each run's span, from load.log and spans.txt (the latest span of a run)
local spans, loads = {}, {}
for _, l in ipairs(lines(dir .. "/spans.txt") or {}) do
  local name, b, e = l:match("^(%S+) (%d+) (%d+)")
  if name then spans[name] = { tonumber(b), tonumber(e) } end
end
for _, l in ipairs(lines(dir .. "/load.log") or {}) do
  local t, one = l:match("^(%d+) ([%d.]+)")
  if t then loads[#loads + 1] = { tonumber(t), tonumber(one) } end
end
local function load_during(name)
  local s = spans[name]
  if not s then return nil end
  local sum, n, hi = 0, 0, 0
  for _, p in ipairs(loads) do
    if p[1] >= s[1] and p[1] <= s[2] then sum, n, hi = sum + p[2], n + 1, math.max(hi, p[2]) end
  end
  return n > 0 and { mean = sum / n, max = hi } or nil
end

-- one record per run: steps = {{time_step, time_generate, time_score, time_train, tokens_generated}},
-- evals = {{step, minutes, accuracy}}, peak_rss_mib, eval_n (held-out prompts per evaluation)
local LABELS = { ["remax:remax"] = "remax ReMax", ["remax:grpo"] = "remax GRPO", ["trl:grpo"] = "TRL GRPO (loss grpo)",
  ["trl:dapo"] = "TRL GRPO (loss dapo)", ["trl:remax"] = "TRL ReMax (seed)", ["remax:tools-remax"] = "remax ReMax, tools",
  ["remax:tools-grpo"] = "remax GRPO, tools", ["trl:tools-grpo"] = "TRL GRPO, tools=" }
local function eval_n(algo) return algo:match("^tools%-") and opts.tools_eval_size or opts.eval_size end
local function add_remax(runs, algo)
  local m = lines(("%s/remax-%s/metrics.jsonl"):format(dir, algo))
  if not m then return end
  local r = { name = "remax:" .. algo, label = LABELS["remax:" .. algo], steps = {}, evals = {}, eval_n = eval_n(algo) }
  local elapsed = 0
  for _, l in ipairs(m) do
    local x = cjson.decode(l)
    if x.time_step then
      elapsed = x.time_elapsed_train
      r.steps[#r.steps + 1] = { time_step = x.time_step, time_generate = x.time_generate, time_score = x.time_score,
        time_train = x.time_train, tokens_generated = x.tokens_per_s * x.time_generate }
    end
    if x.eval_accuracy then
      r.evals[#r.evals + 1] = { step = x.step, minutes = (x.step == 0 and 0 or elapsed) / 60, accuracy = x.eval_accuracy }
    end
  end
  local rss = lines(("%s/remax-%s.rss_kib"):format(dir, algo))
  r.peak_rss_mib = rss and tonumber(rss[#rss]) and tonumber(rss[#rss]) / 1024 or 0
  runs[#runs + 1] = r
end
local function add_trl(runs, algo)
  local f = io.open(("%s/trl-%s.json"):format(dir, algo))
  if not f then return end
  local x = cjson.decode(f:read("*a"))
  f:close()
  local r = { name = "trl:" .. algo, label = LABELS["trl:" .. algo], steps = x.steps, evals = {}, peak_rss_mib = x.peak_rss_mib,
    versions = x.versions, bf16 = x.bf16, eval_n = x.eval_size or eval_n(algo) }
  for _, e in ipairs(x.evals) do
    r.evals[#r.evals + 1] = { step = e.step, minutes = e.train_minutes, accuracy = e.accuracy, tool_calls = e.tool_calls,
      tool_correct = e.tool_correct }
  end
  runs[#runs + 1] = r
end

local function at_step(r, s)
  for _, e in ipairs(r.evals) do if e.step == s then return e end end
end

-- the tables, ratios, equal-step agreement and chart of one family of runs
local function report(title, runs, pairs_, svg)
  local by_name = {}
  for _, r in ipairs(runs) do by_name[r.name] = r end
  print(("\n== %s"):format(title))
  print(("%-22s %5s %9s %26s %10s %9s %9s %11s"):format("run", "steps", "s/step", "(generate, score, train)",
    "median s", "tok/s", "peak MiB", "load 1-min"))
  for _, r in ipairs(runs) do
    local step, gen, score, tr = mean(r.steps, "time_step"), mean(r.steps, "time_generate"), mean(r.steps, "time_score"),
      mean(r.steps, "time_train")
    r.s_per_step, r.median_s = step, median(r.steps, "time_step")
    r.tokens_per_s = mean(r.steps, "tokens_generated") / math.max(step, 1e-9)
    local load = load_during(r.name)
    print(("%-22s %5d %9.2f %26s %10.2f %9.0f %9.0f %11s"):format(r.label, #r.steps, step,
      ("(%.2f, %.3f, %.2f)"):format(gen, score, tr), r.median_s, r.tokens_per_s, r.peak_rss_mib,
      load and ("%.1f (max %.1f)"):format(load.mean, load.max) or "?"))
  end
  print("tok/s: completion tokens generated per second of step time (every row: ReMax's greedy rows too; the model's tokens, not tool results)")

  print("\nratios (remax against TRL, same settings):")
  for _, p in ipairs(pairs_) do
    local a, b = by_name[p[1]], by_name[p[2]]
    if a and b then
      print(("  %-18s vs %-22s step %.1fx faster (median %.1fx), tokens/s %.1fx, peak RSS %.2fx"):format(a.label, b.label,
        b.s_per_step / a.s_per_step, b.median_s / a.median_s, a.tokens_per_s / b.tokens_per_s, a.peak_rss_mib / b.peak_rss_mib))
    end
  end

  print("\nheld-out greedy accuracy at equal steps; two standard errors of the difference in brackets:")
  for _, p in ipairs(pairs_) do
    local a, b = by_name[p[1]], by_name[p[2]]
    if a and b then
      local out, agree, n = {}, 0, 0
      for _, e in ipairs(b.evals) do
        local ea = at_step(a, e.step)
        if ea then
          local se = math.sqrt(ea.accuracy * (1 - ea.accuracy) / a.eval_n + e.accuracy * (1 - e.accuracy) / b.eval_n)
          local ok = math.abs(ea.accuracy - e.accuracy) <= 2 * se
          n, agree = n + 1, agree + (ok and 1 or 0)
          out[#out + 1] = ("%d: %.1f/%.1f (%.1f)%s"):format(e.step, 100 * ea.accuracy, 100 * e.accuracy, 200 * se, ok and "" or " !")
        end
      end
      print(("  %s / %s (%d/%d prompts): %s  -- %d of %d within two standard errors"):format(a.label, b.label, a.eval_n,
        b.eval_n, table.concat(out, "  "), agree, n))
    end
  end

  print("\nheld-out greedy accuracy against training minutes (accuracy%@minutes):")
  local series = {}
  for _, r in ipairs(runs) do
    local pts, txt = {}, {}
    for _, e in ipairs(r.evals) do
      pts[#pts + 1] = { e.minutes, 100 * e.accuracy }
      txt[#txt + 1] = ("%.1f@%.2f"):format(100 * e.accuracy, e.minutes)
    end
    -- remax evaluates every 5 of its many steps: the text keeps one point in four past the first ten
    if #txt > 14 then
      local short = {}
      for i, t in ipairs(txt) do if i <= 10 or i % 4 == 0 or i == #txt then short[#short + 1] = t end end
      txt = short
    end
    print(("  %-22s %s"):format(r.label, table.concat(txt, " ")))
    series[#series + 1] = { name = r.label, points = pts }
  end
  for _, r in ipairs(runs) do
    local last = r.evals[#r.evals]
    if last and last.tool_calls then
      print(("  %s, last evaluation: %.1f%% of greedy episodes call the calculator, %.1f%% use it correctly"):format(r.label,
        100 * last.tool_calls, 100 * last.tool_correct))
    end
    local tu = io.open(("%s/%s/tool_use.json"):format(dir, (r.name:gsub(":", "-"))))
    if tu then
      local t = cjson.decode(tu:read("*a"))
      tu:close()
      if t.after then
        print(("  %s, held-out tool use after: %.1f%% of greedy episodes call the calculator, %.1f%% use it correctly")
          :format(r.label, 100 * t.after.tool_calls, 100 * t.after.tool_correct))
      end
    end
  end
  local f = assert(io.open(dir .. "/" .. svg, "wb"))
  f:write(plot.svg_lines(series, { title = "Held-out greedy accuracy, same training time" .. (svg:match("tools") and
    " (calculator demonstration)" or ""), xlabel = "training minutes", ylabel = "accuracy %", markers = 60 }))
  f:close()
  print(("wrote %s/%s"):format(dir, svg))
end

local plain, tools = {}, {}
add_remax(plain, "remax"); add_remax(plain, "grpo"); add_trl(plain, "grpo"); add_trl(plain, "remax"); add_trl(plain, "dapo")
add_remax(tools, "tools-remax"); add_remax(tools, "tools-grpo"); add_trl(tools, "tools-grpo")
if #plain + #tools == 0 then error("bench/trl_report.lua: no runs in " .. dir, 0) end
if #plain > 0 then
  report("GSM8K-style problems (recipes/gsm8k.lua, models/tiny-gsm8k)", plain, { { "remax:remax", "trl:remax" },
    { "remax:grpo", "trl:grpo" }, { "remax:grpo", "trl:dapo" }, { "remax:remax", "trl:grpo" } }, "accuracy.svg")
end
if #tools > 0 then
  report("the calculator demonstration (recipes/gsm8k_tools.lua, models/tiny-gsm8k-tools)", tools,
    { { "remax:tools-grpo", "trl:tools-grpo" }, { "remax:tools-remax", "trl:tools-grpo" } }, "tools_accuracy.svg")
end
local rw = io.open(dir .. "/reward_summary.json")
if rw then
  local s = cjson.decode(rw:read("*a"))
  rw:close()
  print(("\nrewards/gsm8k.lua against its port, math-verify and OpenAI's labels on %d GSM8K test completions: " ..
    "port agrees on %d, math-verify on %d, OpenAI's is_correct on %d; math-verify against OpenAI: %d " ..
    "(details: %s/reward_disagreements.jsonl)"):format(s.cases, s.lua_vs_py_agree, s.lua_vs_math_verify_agree,
    s.lua_vs_openai_agree, s.math_verify_vs_openai_agree, dir))
end
