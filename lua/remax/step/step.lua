-- remax.step.step: the Step interface, what the Run (remax.run.run) calls to train one step and
-- nothing of the run around it, and the step types that implement it, one file each:
--
--   remax.step.rl            ReMax, GRPO, RLOO, REINFORCE, ...: generate, score, advantage, update
--   remax.step.sft           algo = "sft": the data's answers as targets, one update per step
--   remax.step.reward_model  algo = "reward": a reward model trained on preference pairs
--
-- The RL and SFT steps train a remax.step.policy (the model, its generation, rewards, reference
-- and optimizer); the reward-model step trains a classifier of its own. The Run owns the loop,
-- the step counter, the data order, checkpoints, logs and hot reload, and asks a step only:
--
--   local step = Step.new(pieces, cfg, hooks)     -- pieces: remax.run.setup.pieces's table
--   local m, ro = step:run(batch, {step = n, first = k})   -- one step on this rank's share of
--                                                  -- the batch: metrics, and what it generated
--                                                  -- (gathered on rank 0) or nil
--   step:evaluate(rows, {samples = K})             -- held-out numbers: accuracy, reward, n, ...
--   step:state(without_moments) / step:restore(state)   -- what an exact resume needs of it
--   step:share_from_root()                         -- collective: every rank takes rank 0's
--                                                  -- weights and optimizer state
--   step:completion_records(ro)                    -- what completions.jsonl keeps of ro
--   step:memory_mib()                              -- what it holds for training, in MiB
--   step:checkpoint_model(), step:save(dir), step:save_merged(dir)   -- what the files hold
--   step:reward_functions(), step:trial(r, rows), step:set_reward(i, r), step:set_rewards(list),
--   step:has_reference(), step:load_reference()    -- hot reload (a step without rewards has none)
--
-- A step never reads the run folder, the schedule or the logs; hooks are how it speaks:
-- hooks.say(text) (a line for the user), hooks.progress() (the live progress line or nil) and
-- hooks.on_failure(why) (a reward failed: the Run saves the last finished step). cfg is the
-- resolved settings, read by the step, written only by the Run (hot reload).
local rl = require("remax.step.rl")
local sft = require("remax.step.sft")
local reward_model = require("remax.step.reward_model")

local M = {}

-- The Step interface: the methods every step type has (tests/lua/owners_spec.lua checks them).
M.INTERFACE = { "run", "evaluate", "state", "restore", "share_from_root", "completion_records", "memory_mib",
  "checkpoint_model", "save", "save_merged", "reward_functions", "trial", "set_reward", "set_rewards",
  "has_reference", "load_reference" }

-- The step types: algo = "sft" and "reward" have their own, every other algo is RL.
M.TYPES = { rl = rl, sft = sft, reward = reward_model }

-- The step type (its module) of cfg's algo.
function M.type_of(cfg) return M.TYPES[cfg.algo] or rl end

-- The step of cfg's algo over pieces (remax.run.setup.pieces's table), speaking through hooks.
function M.new(pieces, cfg, hooks)
  return M.type_of(cfg).new(pieces, cfg, hooks)
end

return M
