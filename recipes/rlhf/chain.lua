-- recipes/rlhf/chain.lua: the paper's pipeline on the built-in model, end to end
-- (recipes/rlhf/README.md): (a) preference pairs with a hidden true preference, (b) a reward
-- model trained on them, (c) ReMax against that reward model, twice: beta = 0 and beta > 0.
-- Writes runs/rlhf/results.md (the tables) and runs/rlhf/overoptimisation.svg (the reward
-- model's score and the true preference, sampled, per step, for both runs).
--
--   ./remax run recipes/rlhf/chain.lua                     # the whole chain
--   ./remax run recipes/rlhf/chain.lua --steps 12 --skip_pairs --skip_rm   # stage (c) again
--
-- Options: --problems N (pairs' problems, 256), --steps N (ReMax steps per run, 24), --beta B
-- (the run with a KL, 0.05), --eval_size N (held-out prompts of the ReMax runs, 200),
-- --skip_pairs, --skip_rm (reuse runs/rlhf/pairs_*.jsonl, runs/rlhf/rm).
local config = require("remax.settings.config")
local recipe = require("remax.settings.recipe")
local trainer = require("remax.run.run")
local plot = require("remax.run.plot")
local fs = require("remax.bind.fs")
local now = require("remax.bind.clock").now

local o = { problems = 256, steps = 24, beta = 0.05, eval_size = 200, skip_pairs = false, skip_rm = false }
local i = 1
while arg and i <= #arg do
  local k = arg[i]:match("^%-%-(.+)$")
  if not k or o[k] == nil then error("chain.lua: unknown argument " .. tostring(arg[i]), 0) end
  if o[k] == false then o[k], i = true, i + 1 else o[k], i = tonumber(arg[i + 1]) or arg[i + 1], i + 2 end
end
local here = "recipes/rlhf/"
local t0 = now()
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
    eval_steps = math.max(1, math.floor(o.steps / 4)) })
  runs[#runs + 1] = { beta = beta, res = res, seconds = now() - t, name = name }
end

-- the tables
local lines = { "# RLHF chain results (recipes/rlhf/chain.lua)", "" }
local function add(s) lines[#lines + 1] = s end
if rm_res then
  local first = rm_res.history and rm_res.history[1]
  add(("Reward model: held-out pair accuracy %.1f%% -> %.1f%% (mean margin %.3f), %d steps, %.0f s."):format(
    100 * (rm_res.before and rm_res.before.accuracy or 0), 100 * rm_res.after.accuracy, rm_res.after.margin or 0,
    rm_res.step, times.rm))
  add("")
end
add("| run | RM score (held-out greedy) before -> after | true preference: held-out greedy accuracy before -> after | KL at the end | time |")
add("|---|---|---|---|---|")
for _, r in ipairs(runs) do
  local h = r.res.history
  local last = h[#h]
  add(("| beta = %s | %.3f -> %.3f | %.1f%% -> %.1f%% | %.4f | %.0f s |"):format(r.beta, r.res.before.reward,
    r.res.after.reward, 100 * r.res.before.accuracy, 100 * r.res.after.accuracy, last.kl or 0, r.seconds))
end
add("")
add("Per step (sampled completions): the reward model's score and the true preference (right answers).")
add("")
add("| step | " .. table.concat((function()
  local c = {}
  for _, r in ipairs(runs) do c[#c + 1] = ("beta=%s RM"):format(r.beta); c[#c + 1] = ("beta=%s true"):format(r.beta) end
  return c
end)(), " | ") .. " |")
add("|---" .. string.rep("|---", 2 * #runs) .. "|")
local series = {}
for _, r in ipairs(runs) do
  local xr, yr, xt, yt = {}, {}, {}, {}
  for s, m in ipairs(r.res.history) do
    xr[s], yr[s], xt[s], yt[s] = s, m["reward/rm:rm"], s, m["reward/gsm8k_accuracy"]
  end
  series[#series + 1] = { name = ("RM score, beta = %s"):format(r.beta), x = xr, y = yr }
  series[#series + 1] = { name = ("true preference, beta = %s"):format(r.beta), x = xt, y = yt }
end
for s = 1, o.steps do
  local cells = {}
  for k = 1, #series do
    local v = series[k].y[s]
    cells[k] = v and ("%.3f"):format(v) or ""
  end
  add(("| %d | %s |"):format(s, table.concat(cells, " | ")))
end
add("")
add(("Whole chain: %.0f s."):format(now() - t0))
fs.write_atomic("runs/rlhf/results.md", table.concat(lines, "\n") .. "\n")
local svg = plot.svg_lines(series, { title = "Reward model score vs true preference (sampled)", xlabel = "step",
  ylabel = "RM score / fraction right", integer_x = true, width = 960, height = 360 })
fs.write_atomic("runs/rlhf/overoptimisation.svg", svg)
for _, r in ipairs(runs) do fs.write_atomic(r.res.run_dir .. "/overoptimisation.svg", svg) end
print(table.concat(lines, "\n"))
