-- bench/learning.lua: ReMax against its peers on the default task, same engine, same budget.
--
--   ./remax run bench/learning.lua                       # remax, grpo (4 and 8), rloo: 3 minutes each
--   ./remax run bench/learning.lua --minutes 0 --runs remax:1,remax:2,remax:3    # the recipe as it is, 3 seeds
--
-- Each run is `recipes/gsm8k.lua` as it is (the built-in base model, fresh synthetic prompts, the
-- held-out split of another seed) with only the estimator, its group size and the seed changed,
-- and the same training-time budget (`max_time`; evaluation excluded, so a run that evaluates
-- more often is not penalised; --minutes 0: the recipe's max_steps instead). GRPO and RLOO do not
-- generate the greedy row ReMax needs, so their budget goes to samples only. Prints held-out greedy accuracy against training minutes, a table
-- of start, end, gain and the lowest point, and writes runs/learning/results.json and
-- runs/learning/accuracy.svg (copied into docs/img/ for the README). --from DIR re-reads the runs
-- of an earlier invocation (same --runs) and redraws the table and plot without training.
local remax = require("remax")
local config = require("remax.settings.config")
local trainer = require("remax.run.run")
local plot = require("remax.run.plot")
local runs = require("remax.run.folder")

local RUNS = {   -- name -> overrides of recipes/gsm8k.lua
  remax = { algo = "remax" },
  grpo4 = { algo = "grpo", num_generations = 4, generate_greedy = false },
  grpo8 = { algo = "grpo", num_generations = 8, generate_greedy = false },
  rloo = { algo = "rloo", generate_greedy = false },
}

local args = { minutes = 3, runs = "remax:2,grpo4:2,grpo8:2,rloo:2", out = "runs/learning", from = false }
do
  local argv, i = { ... }, 1
  while i <= #argv do
    local k = argv[i]:match("^%-%-(.+)$")
    if not k or args[k] == nil or argv[i + 1] == nil then
      error(("bench/learning.lua: unknown or incomplete argument %s (use --minutes M, --runs a:seed,..., --out DIR, --from DIR)")
        :format(argv[i]), 0)
    end
    args[k] = k == "minutes" and assert(tonumber(argv[i + 1]), "--minutes: a number") or argv[i + 1]
    if k == "from" then args.out = argv[i + 1] end
    i = i + 2
  end
end

local recipe = dofile("recipes/gsm8k.lua")
local results = {}
os.execute("mkdir -p " .. args.out)

for spec in args.runs:gmatch("[^,]+") do
  local name, seed = spec:match("^(%w+):(%d+)$")
  if not name or not RUNS[name] then
    error(("bench/learning.lua: run '%s': want NAME:SEED with NAME one of remax, grpo4, grpo8, rloo"):format(spec), 0)
  end
  local r = {}
  for k, v in pairs(recipe) do r[k] = v end
  for k, v in pairs(RUNS[name]) do r[k] = v end
  r.seed = tonumber(seed)
  if args.minutes > 0 then r.max_time, r.max_steps = args.minutes * 60, 100000 end
  r.save_steps, r.log_completions = 0, 0
  r.output_dir, r.run_name = args.out, ("%s-seed%s"):format(name, seed)
  local cfg = config.resolve(r, {})
  if not args.from then print(("== %s seed %s: %s"):format(name, seed,
    args.minutes > 0 and ("%g minutes of training"):format(args.minutes) or (r.max_steps .. " steps"))) end
  local t0 = require("remax.bind.clock").now()
  local t, metrics
  if args.from then   -- re-read a finished run instead of training
    metrics = runs.read_jsonl(("%s/%s/metrics.jsonl"):format(args.from, r.run_name))
  else
    t = trainer.new(cfg, { quiet = false, signals = false, recipe_path = "recipes/gsm8k.lua" })
    t:train()
    metrics = t.run:metrics()
  end
  -- held-out accuracy against training minutes (a row without the time has the last one seen)
  local curve, minutes, steps = {}, 0, 0
  for _, m in ipairs(metrics) do
    if m.time_elapsed_train then minutes = m.time_elapsed_train / 60 end
    steps = math.max(steps, m.step or 0)
    if m.eval_accuracy and not (#curve > 0 and curve[#curve].step == m.step) then
      curve[#curve + 1] = { minutes = minutes, step = m.step, accuracy = m.eval_accuracy }
    end
  end
  local start, lowest = curve[1].accuracy, math.huge
  for _, p in ipairs(curve) do lowest = math.min(lowest, p.accuracy) end
  local res = { name = name, seed = tonumber(seed), curve = curve, start = start, final = curve[#curve].accuracy,
    lowest = lowest, steps = steps, wall_minutes = (require("remax.bind.clock").now() - t0) / 60 }
  results[#results + 1] = res
  t = nil
  collectgarbage()
end

print(("\n%-8s %5s %7s %7s %7s %8s %6s  %s"):format("run", "seed", "start", "end", "gain", "lowest", "steps",
  "accuracy at training minutes"))
for _, r in ipairs(results) do
  local pts = {}
  for _, p in ipairs(r.curve) do pts[#pts + 1] = ("%.1f@%.2f"):format(100 * p.accuracy, p.minutes) end
  print(("%-8s %5d %6.1f%% %6.1f%% %+6.1f %7.1f%% %6d  %s"):format(r.name, r.seed, 100 * r.start, 100 * r.final,
    100 * (r.final - r.start), 100 * r.lowest, r.steps, table.concat(pts, " ")))
end

local series = {}
for _, r in ipairs(results) do
  local pts = {}
  for _, p in ipairs(r.curve) do pts[#pts + 1] = { p.minutes, 100 * p.accuracy } end
  series[#series + 1] = { name = ("%s (seed %d)"):format(r.name, r.seed), points = pts }
end
local f = assert(io.open(args.out .. "/accuracy.svg", "wb"))
f:write(plot.svg_lines(series, { title = "Held-out greedy accuracy", xlabel = "training minutes", ylabel = "accuracy %" }))
f:close()
f = assert(io.open(args.out .. "/results.json", "wb"))
f:write(runs.encode(results), "\n")
f:close()
print(("\nwrote %s/accuracy.svg and %s/results.json"):format(args.out, args.out))
