-- remax.settings.inert: settings that do nothing under the others a run chose (scale_rewards under
-- ReMax, epsilon with num_iterations = 1, lora_r without use_lora, ...). A run given one says so
-- once, at the start, instead of silently ignoring it. See docs/trainer.md.
--
--   local lines = inert.check(cfg, given)   -- given[key] = true for keys the recipe or command line set
local M = {}

local function rl_algo(cfg) return cfg.algo ~= "sft" end

-- {keys, applies(cfg) -> bool, what makes them matter}
M.rules = {
  { { "scale_rewards", "multi_objective_aggregation" }, function(c) return c.algo == "grpo" and not c.advantage end,
    "only algo = grpo uses it" },
  { { "reinforce_baseline", "baseline_momentum" }, function(c) return c.algo == "reinforce" and not c.advantage end,
    "only algo = reinforce uses it" },
  { { "epsilon", "epsilon_high", "delta", "importance_sampling_level" }, function(c) return rl_algo(c) and c.num_iterations > 1 end,
    "the ratio pi/pi_old is 1 with num_iterations = 1, so nothing is clipped (TRL's mu)" },
  { { "kl_estimator" }, function(c) return rl_algo(c) and c.beta > 0 end, "beta = 0: there is no KL term" },
  { { "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules" }, function(c) return c.use_lora end,
    "use_lora = false" },
  { { "max_tokens_per_microbatch" }, function(c) return c.padding_free end,
    "padding_free = false pads each micro-batch instead of packing it" },
  { { "beta", "num_generations", "num_iterations", "loss_type", "generate_greedy" },
    rl_algo, "algo = sft trains on the answers, without sampled completions" },
}

local function same(a, b)
  if type(a) == "table" and type(b) == "table" then
    if #a ~= #b then return false end
    for i = 1, #a do if a[i] ~= b[i] then return false end end
    return true
  end
  return a == b
end

-- The lines to print: one per setting that was given a value other than its default and does
-- nothing under this config.
function M.check(cfg, given, keys)
  keys = keys or require("remax.settings.config").keys
  local out = {}
  for _, rule in ipairs(M.rules) do
    if not rule[2](cfg) then
      for _, k in ipairs(rule[1]) do
        local decl = keys[k]
        if given[k] and decl and not same(cfg[k], decl.default) then
          out[#out + 1] = ("note: %s = %s has no effect here: %s"):format(k,
            require("remax.settings.config").show(cfg[k]), rule[3])
        end
      end
    end
  end
  return out
end

return M
