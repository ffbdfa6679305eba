-- remax.settings.inert: settings that do nothing under the others a run chose (scale_rewards under
-- ReMax, epsilon with num_iterations = 1, lora_r without use_lora, ...). A run given one says so
-- once, at the start, instead of silently ignoring it. See docs/trainer.md.
--
--   local lines = inert.check(cfg, given, config.keys, config.show)   -- given[key] = true for keys the recipe or command line set
--
-- It also says where a value copied from TRL means something else here (M.trl_notes, and
-- M.data_notes once the data is loaded): see docs/trainer.md, "Coming from TRL".
local M = {}

local function rl_algo(cfg) return cfg.algo ~= "sft" and cfg.algo ~= "reward" end   -- sampled completions

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
    rl_algo, "this algo (sft: the answers; reward: preference pairs) trains without sampled completions" },
  -- the agent settings (issue 45): episodes exist only with tools or an environment
  { { "max_turns", "max_tool_calling_iterations", "max_episode_length", "strict_episodes", "tool_timeout" },
    function(c) return c.tools ~= nil or c.environment ~= nil end,
    "there are no tools and no environment, so every completion is one turn (no episodes)" },
  { { "tool_call_format" }, function(c) return c.tools ~= nil end, "there are no tools to call" },
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
function M.check(cfg, given, keys, show)
  -- keys and show: remax.settings.config's declarations and value printer (passed in: config
  -- requires this module, so this one does not require config back)
  assert(keys and show, "inert.check(cfg, given, config.keys, config.show)")
  local out = {}
  for _, rule in ipairs(M.rules) do
    if not rule[2](cfg) then
      for _, k in ipairs(rule[1]) do
        local decl = keys[k]
        if given[k] and decl and decl.alias_of then   -- another project's name, its value moved to its target
          out[#out + 1] = ("note: %s has no effect here: %s"):format(k, rule[3])
        elseif given[k] and decl and not same(cfg[k], decl.default) then
          out[#out + 1] = ("note: %s = %s has no effect here: %s"):format(k,
            show(cfg[k]), rule[3])
        end
      end
    end
  end
  return out
end

-- Notes for values a TRL user copies whose meaning differs here. given: keys the recipe or
-- command line set; cli: the command line's settings.
function M.trl_notes(cfg, given, cli)
  local out = {}
  cli = cli or {}
  if given.per_device_train_batch_size and rl_algo(cfg) then
    local n, g = cfg.per_device_train_batch_size, cfg.num_generations or 1
    local greedy = cfg.generate_greedy and 1 or 0
    local rows = n * (g + greedy)
    out[#out + 1] = ("note: per_device_train_batch_size = %d counts prompts (TRL counts completions): each micro-batch is "
      .. "%d prompts x %d rows (%d generations%s) = %d rows; TRL's per_device_train_batch_size = %d with num_generations = %d "
      .. "is per_device_train_batch_size = %s here"):format(n, n, g + greedy, g, greedy > 0 and " + 1 greedy" or "", rows, n, g,
      (n % g == 0) and tostring(math.floor(n / g)) or ("%d / %d (not a whole number of prompts)"):format(n, g))
  end
  if cli.data ~= nil and cli.eval_data == nil and cfg.eval_data == nil and type(cfg.data) == "string" and (cfg.eval_size or 0) > 0 then
    out[#out + 1] = ("note: --data %s without --eval_data: this run skips evaluation (a data file has no test split; "
      .. "the recipe's evaluation, if any, came from its own data); give --eval_data FILE to evaluate"):format(cfg.data)
  end
  return out
end

-- Notes about the training rows of a data file, once they are loaded: plain-string prompts
-- (TRL's standard, non-conversational format, which TRL passes to the model as written) are
-- rendered here as one user message through the chat template. Nothing to say under
-- chat_template = "plain", which leaves a string as it is. (A recipe's data function makes rows
-- for its own template: not said.)
function M.data_notes(rows, template_name, source)
  local first = rows and rows[1]
  if not first or type(first.prompt) ~= "string" or template_name == "plain" then return {} end
  local line = ("note: the prompts of %s are plain strings (TRL's standard format, which TRL passes to the model as "
    .. "written); remax renders each as one user message through the chat template '%s'. For the text as written, "
    .. "set chat_template = \"plain\""):format(source or "the data", tostring(template_name))
  if template_name == "qa" and first.prompt:match("^%s*Question:") then
    line = line .. (" (the prompts already start with \"Question:\", and the qa template adds another)")
  end
  return { line }
end

return M
