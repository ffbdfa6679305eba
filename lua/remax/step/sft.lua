-- remax.step.sft: the SFT step (algo = "sft"), supervised fine-tuning of the Policy on the data's
-- answers: each prompt's target is its answer column plus EOS, and only the target's tokens
-- count in the loss (advantage 1, one optimizer update per step, no entropy terms). Evaluation
-- generates and scores as the RL step's does, so the two compare on the same held-out numbers.
-- It implements the Step interface of remax.step.step; the update, generation and rewards are
-- the Policy's (remax.step.policy).
local policy_mod = require("remax.step.policy")
local evaluate = require("remax.step.evaluate")

local M = {}
local Step = {}
Step.__index = Step
M.Step = Step

-- pieces: remax.run.setup.pieces's table (the Policy's, remax.step.policy.new). hooks: say,
-- progress, on_failure (each optional).
function M.new(pieces, cfg, hooks)
  return setmetatable({ cfg = cfg, dist = pieces.world, accuracy_name = pieces.accuracy_name,
    policy = policy_mod.new(pieces, cfg, hooks) }, Step)
end

-- Training rows for prompts: target = the answer column + EOS, cut to max_completion_length;
-- only target tokens count.
function Step:target_rows(prompt_rows)
  local cfg, policy = self.cfg, self.policy
  local col = cfg.answer_column or "answer"
  local list = {}
  for i, row in ipairs(prompt_rows) do
    local p = policy:encode_prompt(row.prompt)
    local target = row[col]
    if type(target) ~= "string" then
      error(("algo = sft: row %d has no string '%s' column (the target)"):format(i, col), 0)
    end
    local ids = policy:encode_text(target)
    ids[#ids + 1] = policy:eos_id()
    if #ids > cfg.max_completion_length then
      local cut = {}
      for t = 1, cfg.max_completion_length do cut[t] = ids[t] end
      ids = cut
    end
    list[i] = { prompt = i, prompt_ids = p, completion = ids, adv = 1 }
  end
  return list
end

---------------------------------------------------------------------------- the Step interface

-- One update on this rank's prompts' targets; returns its metrics (no rollout: nothing was
-- generated). ctx.step: the step's number.
function Step:run(batch, ctx)
  local step = assert(ctx and ctx.step, "Step:run: ctx.step (the step number) is required")
  local rows = self:target_rows(batch)
  local up = self.policy:update(rows, { step = step, iterations = 1, entropy = false })
  local m = { loss = up.loss, grad_norm = up.grad_norm, lr = up.lr, time_train = up.time_train,
    tokens_per_s = up.tokens_trained / math.max(up.time_train, 1e-9),
    completion_length_mean = up.tokens_total / up.rows_total, time_generate = 0, time_score = 0 }
  local maxlen = 0
  for _, r in ipairs(rows) do maxlen = math.max(maxlen, #r.completion) end
  m.completion_length_max = maxlen
  if not up.finite then m.skipped, m.bad_loss, m.bad_norm = true, up.bad_loss, up.bad_norm end
  return m, nil
end

-- SFT logs no completions (it generates none while training).
function Step:completion_records() return {} end

-- What an exact resume needs: the optimizer's state (remax.step.policy's Policy:state).
function Step:state(without_moments) return self.policy:state(without_moments) end
function Step:restore(state) self.policy:restore(state) end

-- Held-out evaluation of rows (remax.step.evaluate), as the RL step's.
function Step:evaluate(rows, opts)
  return evaluate.run({ policy = self.policy, cfg = self.cfg, world = self.dist, accuracy_name = self.accuracy_name }, rows, opts)
end

-- The Policy's generation and scoring (for recipe loops and tasks), and the rest of the Step
-- interface: ranks, memory, files, hot reload.
function Step:rollout(prompt_rows, opts) return self.policy:rollout(prompt_rows, opts) end
function Step:score(ro, opts) return self.policy:score(ro, opts) end
function Step:encode_prompt(prompt) return self.policy:encode_prompt(prompt) end
function Step:share_from_root() return self.policy:share_from_root() end
function Step:memory_mib() return self.policy:memory_mib() end
function Step:checkpoint_model() return self.policy:checkpoint_model() end
function Step:save(dir) return self.policy:save(dir) end
function Step:save_merged(dir) return self.policy:save_merged(dir) end
function Step:reward_functions() return self.policy:reward_functions() end
function Step:trial(r, train_rows) return self.policy:trial(r, train_rows) end
function Step:set_rewards(list) return self.policy:set_rewards(list) end
function Step:set_reward(i, r) return self.policy:set_reward(i, r) end
function Step:has_reference() return self.policy:has_reference() end
function Step:load_reference() return self.policy:load_reference() end

return M
