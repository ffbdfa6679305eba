-- remax.tasks.gsm8k: what a recipe needs to train on GSM8K-style math problems, kept out of the
-- generic trainer: fresh synthetic problems as a data function (remax.tasks.gsm8k_synth makes
-- them), with the held-out split for evaluation. The reward is rewards/gsm8k.lua
-- (gsm8k_accuracy, marked accuracy = true so evaluation reports it as the accuracy), and the
-- built-in byte-level models use the "qa" prompt template (remax.text.chat).
--
--   local gsm8k = require("remax.tasks.gsm8k")
--   return { data = gsm8k.synthetic({ steps = { 1, 2 }, max_number = 12 }), rewards = { "gsm8k" }, ... }
local synth = require("remax.tasks.gsm8k_synth")
local data = require("remax.formats.data")

local M = {}

-- A data function (the `data` setting of a recipe): function(split, n, cfg) -> n problems of
-- split "train" or "test", seeded by cfg.seed. opts: steps = {min, max} arithmetic steps
-- (default {1, 4}), max_number (100), style ("sentences", "equations", "direct" or a mix such as
-- "direct:0.65,sentences:0.35"; see remax.tasks.gsm8k_synth).
function M.synthetic(opts)
  opts = opts or {}
  local steps, max_number, style = opts.steps or { 1, 4 }, opts.max_number or 100, opts.style or "sentences"
  if type(steps) ~= "table" or #steps ~= 2 then
    error("gsm8k.synthetic: steps must be two numbers {min, max}", 2)
  end
  synth.parse_style(style)   -- a bad style stops here, in the recipe, not at the first step
  return function(split, n, cfg)
    local rows = synth.generate(n, { seed = cfg.seed, steps = steps, max_number = max_number, style = style, split = split })
    return data.from_rows(rows, { name = ("gsm8k_synth(%s)"):format(split) })
  end
end

return M
