-- remax.run.trl_names: the names TRL's GRPOTrainer logs, for the metrics remax writes to
-- TensorBoard and metrics.csv (metrics.jsonl keeps remax's own keys). Dashboards built for TRL
-- read train/reward, train/rewards/<name>/mean, train/kl, ...: transformers' TensorBoard callback
-- prefixes training metrics with "train/" and turns "eval_" into "eval/". See docs/runs.md.
--
--   trl_names.tag("reward/gsm8k")   --> "train/rewards/gsm8k/mean"
--   trl_names.tag("eval_accuracy")  --> "eval/accuracy"
local M = {}

-- remax key -> TRL's name (before the train/ prefix), each as GRPOTrainer logs it.
M.renames = {
  lr = "learning_rate",
  completion_length_mean = "completions/mean_length",
  completion_length_min = "completions/min_length",
  completion_length_max = "completions/max_length",
  completion_length_terminated_mean = "completions/mean_terminated_length",
  truncated_fraction = "completions/clipped_ratio",
}

-- The TensorBoard / CSV name of a metrics.jsonl key ("step" stays "step").
function M.tag(key)
  if key == "step" then return key end
  local eval = key:match("^eval_(.+)$")
  if eval then return "eval/" .. eval end
  local name = key:match("^reward/(.+)$")
  if name then return "train/rewards/" .. name .. "/mean" end
  name = key:match("^reward_greedy/(.+)$")
  if name then return "train/rewards_greedy/" .. name .. "/mean" end
  return "train/" .. (M.renames[key] or key)
end

-- A row with every key renamed.
function M.row(row)
  local out = {}
  for k, v in pairs(row) do
    if type(k) == "string" then out[M.tag(k)] = v else out[k] = v end
  end
  return out
end

return M
