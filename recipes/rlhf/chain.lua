-- recipes/rlhf/chain.lua: the paper's pipeline on the built-in model, end to end
-- (recipes/rlhf/README.md): (a) preference pairs with a hidden true preference, (b) a reward
-- model trained on them, (c) ReMax against that reward model, twice: beta = 0 (free to
-- over-optimise the reward model) and beta > 0 (the original's per-token KL).
-- Writes runs/rlhf/results.md (the tables) and runs/rlhf/overoptimisation.svg (the reward
-- model's score and the true preference, sampled, per step, for both runs; also copied into each
-- ReMax run's folder, whose index.html draws the same two lines as rewards.svg).
-- Every stage has a fixed seed (pairs 21, reward model 4, ReMax 2): a second chain on the same
-- machine gives the same numbers.
--
--   ./remax run recipes/rlhf/chain.lua                     # the whole chain (about 10 min on 2 cores)
--   ./remax run recipes/rlhf/chain.lua --steps 12 --skip_pairs --skip_rm   # stage (c) again
--
-- Options: --problems N (pairs' problems, 256), --steps N (ReMax steps per run, 30), --beta B
-- (the run with a KL, 0.2), --learning_rate LR (ReMax's, 3e-4), --eval_size N (held-out prompts
-- of the ReMax runs, 100), --window N (running mean of the per-step table's summary, 4),
-- --skip_pairs, --skip_rm (reuse runs/rlhf/pairs_*.jsonl, runs/rlhf/rm).
local config = require("remax.settings.config")
local recipe = require("remax.settings.recipe")
local trainer = require("remax.run.run")
local plot = require("remax.run.plot")
local fs = require("remax.bind.fs")
local cjson = require("cjson")
local now = require("remax.bind.clock").now

local o = { problems = 256, steps = 30, beta = 0.2, learning_rate = 3e-4, eval_size = 100, window = 4,
  skip_pairs = false, skip_rm = false }
local i = 1
while arg and i <= #arg do
  local k = arg[i]:match("^%-%-(.+)$")
  if not k or o[k] == nil then error("chain.lua: unknown argument " .. tostring(arg[i]), 0) end
  if o[k] == false then o[k], i = true, i + 1 else
    if arg[i + 1] == nil then error("chain.lua: --" .. k .. " needs a value", 0) end
    o[k], i = tonumber(arg[i + 1]) or arg[i + 1], i + 2
  end
end
local here = "recipes/rlhf/"
local function load_average()
  local s = fs.read_text("/proc/loadavg")
  return s and s:match("^(%S+ %S+ %S+)") or "?"
end
local t0, load0 = now(), load_average()
local times = {}

if not o.skip_pairs then   -- (a)
  local t = now()
  local saved = arg
  arg = { "runs/rlhf", tostring(o.problems) }
  dofile(here .. "pairs.lua")
  arg = saved
  times.pairs = now() - t
end

-- the chain's runs have fixed names: a second chain replaces the first one's
local function run(path, overrides)
  overrides.overwrite_output_dir = true
  local cfg = config.resolve(recipe.load(path), overrides)
  local tr = trainer.new(cfg, { recipe_path = path })
  return tr:train()
end

-- the evaluations of a run folder (metrics.jsonl rows with eval_accuracy), by step
local function evals(dir)
  local out = {}
  for line in (fs.read_text(dir .. "/metrics.jsonl") or ""):gmatch("[^\n]+") do
    local m = cjson.decode(line)
    if m.eval_accuracy then out[#out + 1] = m end
  end
  return out
end

local rm_res
if not o.skip_rm then   -- (b)
  local t = now()
  rm_res = run(here .. "reward_model.lua", {})
  times.rm = now() - t
end

-- (c) ReMax against the reward model, without and with the KL
local runs = {}
for _, beta in ipairs({ 0, o.beta }) do
  local t = now()
  local name = ("rlhf-remax-beta%s"):format(beta)
  local res = run(here .. "remax.lua", { beta = beta, max_steps = o.steps, eval_size = o.eval_size, run_name = name,
    learning_rate = o.learning_rate, eval_steps = math.max(1, math.floor(o.steps / 2)) })
  runs[#runs + 1] = { beta = beta, res = res, seconds = now() - t, name = name, evals = evals(res.run_dir) }
end
local total, load1 = now() - t0, load_average()

-- the tables
local lines = { "# RLHF chain results (recipes/rlhf/chain.lua)", "" }
local function add(s) lines[#lines + 1] = s end
if times.pairs then add(("Pairs: %.0f s."):format(times.pairs)) end
if rm_res then
  add(("Reward model: held-out pair accuracy %.1f%% -> %.1f%% (mean margin %.3f), %d steps, %.0f s."):format(
    100 * (rm_res.before and rm_res.before.accuracy or 0), 100 * rm_res.after.accuracy, rm_res.after.margin or 0,
    rm_res.step, times.rm))
end
add("")
add("Held-out greedy answers (" .. o.eval_size .. " problems): the reward model's mean score and the true preference "
  .. "(the share with the right final answer), at each evaluation.")
add("")
add("| run | step | RM score | true preference | KL per token (last step) | time |")
add("|---|---|---|---|---|---|")
for _, r in ipairs(runs) do
  local h = r.res.history
  for k, e in ipairs(r.evals) do
    add(("| beta = %s | %d | %.3f | %.1f%% | %s | %s |"):format(r.beta, e.step, e.eval_reward or 0 / 0,
      100 * e.eval_accuracy, k == #r.evals and ("%.4f"):format(h[#h].kl or 0) or "",
      k == #r.evals and ("%.0f s"):format(r.seconds) or ""))
  end
end
add("")
add(("Per step, sampled completions (16 prompts x 4): the reward model's score and the true preference; "
  .. "running means of %d steps in the summary below."):format(o.window))
add("")
local series, summaries = {}, {}
for _, r in ipairs(runs) do
  local xr, yr, xt, yt = {}, {}, {}, {}
  for s, m in ipairs(r.res.history) do
    xr[s], yr[s], xt[s], yt[s] = s, m["reward/rm:rm"], s, m["reward/gsm8k_accuracy"]
  end
  local score = { name = ("RM score, beta = %s"):format(r.beta), x = xr, y = yr }
  local truth = { name = ("true preference, beta = %s"):format(r.beta), x = xt, y = yt }
  series[#series + 1], series[#series + 2] = score, truth
  summaries[#summaries + 1] = { beta = r.beta, s = plot.overoptimisation(score, truth, { window = o.window }) }
end
local head = {}
for _, r in ipairs(runs) do head[#head + 1] = ("beta=%s RM"):format(r.beta); head[#head + 1] = ("beta=%s true"):format(r.beta) end
add("| step | " .. table.concat(head, " | ") .. " |")
add("|---" .. string.rep("|---", 2 * #runs) .. "|")
for s = 1, o.steps do
  local cells = {}
  for k = 1, #series do
    local v = series[k].y[s]
    cells[k] = v and ("%.3f"):format(v) or ""
  end
  add(("| %d | %s |"):format(s, table.concat(cells, " | ")))
end
add("")
add("Over-optimisation (running means): the step where the true preference peaked, and the two metrics there and at the end.")
add("")
add("| run | truth peaks at step | RM score there -> at the end | true preference there -> at the end | score rises after the truth's peak |")
add("|---|---|---|---|---|")
for _, u in ipairs(summaries) do
  local s = u.s
  add(("| beta = %s | %d | %.3f -> %.3f | %.3f -> %.3f | %s |"):format(u.beta, s.truth_peak_step, s.score_at_peak,
    s.score_after_peak, s.truth_peak, s.truth_after_peak, s.overoptimised and "yes" or "no"))
end
add("")
add(("Whole chain: %.0f s (load average %s at the start, %s at the end)."):format(total, load0, load1))
fs.write_atomic("runs/rlhf/results.md", table.concat(lines, "\n") .. "\n")
local svg = plot.svg_lines(series, { title = "Reward model score vs true preference (sampled)", xlabel = "step",
  ylabel = "RM score / fraction right", integer_x = true, width = 960, height = 360 })
fs.write_atomic("runs/rlhf/overoptimisation.svg", svg)
for _, r in ipairs(runs) do fs.write_atomic(r.res.run_dir .. "/overoptimisation.svg", svg) end
print(table.concat(lines, "\n"))
