-- remax.run.run: the Run, a training run's lifecycle: its folder runs/<name>/ (named, opened, or
-- found again on --resume; rank 0 alone writes it), the data order, the step counter, the state
-- an exact resume needs, checkpoints (also when a reward fails or too many steps go bad), the
-- loop with Ctrl-C and max_time, hot reload, the evaluation schedule, the record of each
-- finished step (metrics, completions, evaluation, progress line), and the plots.
--
--   local run = Run.new(cfg, {recipe_path = "recipes/gsm8k.lua"})
--   run:train()
--
-- One update is the Step's (remax.step.step's interface, run.stepper: the RL, SFT or reward-model
-- step of the algo): the Run hands it this rank's prompts and gets metrics back (stepper:run),
-- asks it for its resume state (stepper:state/restore), for evaluations (stepper:evaluate) and
-- for what the files hold, always through its methods, and knows nothing of estimators,
-- rewards or generation.
local config = require("remax.settings.config")
local setup = require("remax.run.setup")
local reload = require("remax.run.reload")
local step_mod = require("remax.step.step")
local guard = require("remax.step.guard")
local async = require("remax.run.async")   -- asynchronous rollouts (issue 46)
local rollout_ranks = require("remax.run.rollout_ranks")   -- on ranks of their own (issue 46)
local dist = require("remax.bind.dist")
local now = require("remax.bind.clock").now
local recipe_mod = require("remax.settings.recipe")
local signals = require("remax.bind.signals")
local fs = require("remax.bind.fs")
local file_exists, read_file = fs.exists, fs.read_text
local signal_pending = signals.pending

local M = {}
local Run = {}
Run.__index = Run
M.Run = Run
local methods = Run   -- the Run's methods (this file alone defines them)

-- A run that writes nothing (remax eval).
local NullRun = {}
NullRun.__index = NullRun
for _, f in ipairs({ "log_metrics", "log_completions", "save_checkpoint", "plot" }) do NullRun[f] = function() end end
function NullRun:latest_checkpoint() return nil end
function NullRun:metrics() return {} end

-- Peak resident memory of this process in MiB (Linux), else the model's own accounting.
local function peak_memory_mib(model)
  local status = read_file("/proc/self/status")
  local kb = status and tonumber(status:match("VmHWM:%s*(%d+)"))
  if kb then return kb / 1024 end
  local m = model:memory()
  return (m.params + m.grads + m.activations + m.head) / 1048576
end

-- A line for the user (rank 0, unless quiet), above the live progress line when there is one.
function methods.say(self, text)
  if self.quiet then return end
  if self.progress then self.progress:log(text) else print(text) end
end

-- cfg: a resolved config (remax.settings.config.resolve). opts: recipe_path, overrides (for hot
-- reload), quiet, signals (install the Ctrl-C handler; default true), eval_only (remax eval:
-- nothing is written).
function M.new(cfg, opts)
  opts = opts or {}
  setup.check_base_model(cfg)   -- before a run folder is made
  setup.check_memory(cfg)       -- a step's generation fits in memory, before any model loads
  local options = require("remax.bind.options")
  options.apply(cfg)   -- the Engine settings, before anything loads
  local world = dist.world()   -- a world of one unless an MPI launcher started this process
  -- issue 35: collectives time out after dist_timeout; the ranks agree on their settings first
  world:set_timeout(cfg.dist_timeout or 1800)
  require("remax.run.agree").settings(world, cfg)
  local self = setmetatable({ cfg = cfg, opts = opts, quiet = opts.quiet or not world.is_root, step = 0,
    bad_steps = 0, reloads = 0, history = {}, watch = {}, dist = world }, Run)
  self.recipe_path = opts.recipe_path
  self.recipe_dir = self.recipe_path and require("remax.step.rewards").dirname(self.recipe_path) or nil
  self:setup_run()
  for _, note in ipairs(cfg.inert_notes or {}) do self:say(note) end   -- settings that do nothing here
  if options.overrides() then self:say("engine options set by the environment (developer overrides): " .. options.overrides()) end
  local ok, err = xpcall(function()
    -- prompts_per_step: this rank's; the sampler draws the global batch and each rank takes its share
    self.prompts_per_step = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
    -- with rollout ranks the Step of every rank sees a world of its own (remax.run.rollout_ranks)
    local trainers = rollout_ranks.wanted(cfg) and rollout_ranks.trainers(cfg, world) or world.size
    self.step_world = rollout_ranks.wanted(cfg) and rollout_ranks.alone(world) or world
    self.global_prompts_per_step = self.prompts_per_step * trainers
    local pieces = setup.pieces(cfg, { world = self.step_world, is_root = world.is_root, run_dir = self.run_dir, eval_only = opts.eval_only,
      resume_model_dir = self.resume_model_dir, recipe_dir = self.recipe_dir,
      prompts_per_step = self.global_prompts_per_step })
    require("remax.run.agree").model(world, pieces.model)   -- issue 35: the same model on every rank
    require("remax.run.agree").rewards(world, pieces.rewards)   -- issue 45: and the same reward code
    for _, note in ipairs(pieces.notes or {}) do self:say(note) end   -- what setup left out of the data
    if pieces.max_steps_changed and self.run.write_config then self.run:write_config(config.serializable(cfg)) end
    self.train_ds, self.eval_ds = pieces.train_ds, pieces.eval_ds
    self.sampler = self.train_ds:sampler({ seed = cfg.seed, shuffle = true, batch_size = self.global_prompts_per_step })
    -- the step type of the algo (remax.step.step): RL, SFT, or a reward model's
    self.stepper = step_mod.new(pieces, cfg, {
      say = function(text) self:say(text) end,
      progress = function() return self.progress end,
      on_failure = function(why) self:save_on_failure(why) end,
    })
    -- read often by the loop, recipes and tests; the Step owns them
    self.model, self.tok, self.model_source = pieces.model, pieces.tok, pieces.model_source
    self.template_name, self.accuracy_name = pieces.template_name, pieces.accuracy_name
    if rollout_ranks.wanted(cfg) then   -- generation and scoring on ranks of their own
      self.async = rollout_ranks.new(cfg, { stepper = self.stepper, world = world, sampler = self.sampler, trainers = trainers })
      if self.async.role == "generator" then self.eval_ds = nil end   -- the trainer evaluates
    elseif async.wanted(cfg) then   -- rollouts generated ahead by older weights (remax.run.async)
      self.async = async.new(cfg, { stepper = self.stepper, world = world, next_batch = function() return self:next_batch(), self.batch_first end })
    end
    if cfg.hot_reload then reload.snapshot(self) end
    if self.resume_state then self:restore(self.resume_state) end
    self:share_state()
    if self.async and self.async.start then self.async:start(self.step) end
  end, guard.traceback)   -- REMAX_DEBUG=1 keeps the traceback
  if not ok then
    -- a failed start leaves no half-made run folder behind (a resumed or replaced run's folder stays)
    if self.fresh_run_dir then
      if self.run and self.run.close then pcall(self.run.close, self.run) end
      pcall(require("remax.bind.fs").remove_tree, self.fresh_run_dir)
    end
    if self.run and self.run.release then pcall(self.run.release, self.run) end   -- the folder's lock (issue 35)
    error(err, 0)
  end
  return self
end

-- This rank's share (whole prompts) of the step's global batch; batch_first is the place of its
-- first prompt in the global batch (the Step keys sampling by place).
function methods.next_batch(self)
  self.sampler_before = self.sampler_before or self.sampler:state()   -- the unfinished step's start (state())
  local rows, first = self.dist:share(self.sampler:next_batch())
  self.batch_first = first
  return rows
end

-- Every rank starts from rank 0's weights, optimizer state and counters: rank 0 alone reads the
-- run folder (which other machines may not see), and the ranks must take identical steps.
function methods.share_state(self)
  local d = self.dist
  if d.size == 1 then return end
  self.stepper:share_from_root()   -- the weights and the optimizer's moments (under ZeRO each rank's shard)
  local s = d:broadcast(self:state(true))   -- the counters, the data order, the step count
  if not d.is_root then self:restore(s) end
end

function methods.setup_run(self)
  if self.opts.eval_only then
    self.run = setmetatable({}, NullRun)
    self.run_dir = os.tmpname()
    os.remove(self.run_dir)
    self.run_name = "eval"
    return
  end
  if self.dist.size == 1 then return self:open_run() end
  -- rank 0 alone names, writes (and on resume reads) runs/<name>/; the others learn its name
  local ok, err = true, nil
  if self.dist.is_root then ok, err = pcall(self.open_run, self) end
  local shared = self.dist:broadcast({ ok = ok, err = not ok and tostring(err) or nil, dir = self.run_dir })
  if not shared.ok then error(shared.err, 0) end
  if not self.dist.is_root then
    self.run_dir, self.run_name = shared.dir, shared.dir:match("([^/]+)$")
    self.run = setmetatable({}, NullRun)
  end
end

function methods.open_run(self)
  local cfg = self.cfg
  local runs = require("remax.run.folder")
  local dir
  if cfg.resume then
    dir = cfg.resume:gsub("/+$", "")
    if not file_exists(dir .. "/config.json") then
      error(("--resume %s: no run there (no config.json)"):format(cfg.resume), 0)
    end
  else
    local name = cfg.run_name
    if not name then
      name = (self.recipe_path and recipe_mod.name(self.recipe_path) or "run") .. "-" .. os.date("%Y%m%d-%H%M%S")
      local base, k = name, 1
      while file_exists(cfg.output_dir .. "/" .. name .. "/config.json") do
        k = k + 1
        name = base .. "-" .. k
      end
    end
    dir = cfg.output_dir .. "/" .. name
  end
  self.run_dir = dir
  self.run_name = dir:match("([^/]+)$")
  -- issue 45: the final model must not land on the run's own folder or checkpoints (it would
  -- replace a checkpoint's weights under its trainer state, or the run's config.json)
  if cfg.save_final_model then
    local target, run, ckpts = fs.real_path(cfg.save_final_model), fs.real_path(dir), fs.real_path(dir) .. "/checkpoints"
    if target == run or target == ckpts or target:sub(1, #ckpts + 1) == ckpts .. "/" then
      error(("save_final_model = %s is %s, where the final model would overwrite what the run keeps there; "
        .. "give a folder outside %s (%s/final, say)"):format(cfg.save_final_model,
        target == run and "this run's own folder" or "in this run's checkpoints folder " .. ckpts, ckpts, run), 0)
    end
  end
  if not cfg.resume and not fs.is_dir(dir) then self.fresh_run_dir = dir end   -- removed again if the start fails
  local ok, run = pcall(runs.open, dir, { config = config.serializable(cfg), resume = cfg.resume ~= nil,
    overwrite = cfg.overwrite_output_dir and not cfg.resume, report_to = cfg.report_to })
  if not ok then
    if tostring(run):match("already holds a run") then
      error(("%s already holds a run: continue it with --resume %s, replace it with --overwrite_output_dir, or choose another --run_name")
        :format(dir, dir), 0)
    end
    -- a folder another process holds is never removed, even if it looked new a moment ago
    if self.fresh_run_dir and not tostring(run):find(runs.IN_USE, 1, true) then pcall(fs.remove_tree, self.fresh_run_dir) end
    error(run, 0)
  end
  self.run = run
  if run.lock_note then self:say(run.lock_note) end
  if cfg.resume then
    local ckpt = self.run:latest_checkpoint()
    if not ckpt then error(("--resume %s: the run has no checkpoint yet"):format(cfg.resume), 0) end
    local state, tensors, model_dir = self.run:load_checkpoint(ckpt)
    state.tensors = tensors
    self.resume_state, self.resume_model_dir, self.resume_ckpt = state, model_dir, ckpt
  end
end

-- Everything an exact resume needs: data position, counters, and the Step's state (optimizer,
-- baseline; RNG seeds derive from (seed, step), so they need no state). Collective under ZeRO
-- (the moments are gathered) unless without_moments.
function methods.state(self, without_moments)
  local st = self.stepper:state(without_moments)
  -- the rows generated ahead are part of the state (a collective: rank 0 keeps every rank's)
  local async_state = self.async and self.async:state() or nil
  return { async = async_state,
    -- mid-step (a failure's or an interruption's checkpoint): the data position of the step's start,
    -- so that a resume draws the unfinished step's prompts again
    step = self.step, sampler = self.sampler_before or self.sampler:state(), optimizer_step = st.optimizer_step,
    bad_steps = self.bad_steps, reloads = self.reloads, baseline = st.baseline,
    eval_history = self.eval_history, train_seconds = self.train_seconds, tensors = st.tensors,
    world_size = self.dist.size, global_prompts_per_step = self.global_prompts_per_step,
  }
end

function methods.restore(self, state)
  local g = state.global_prompts_per_step
  if g and g ~= self.global_prompts_per_step then
    local w = state.world_size or 1
    error(("--resume %s: its checkpoint was written by %d rank(s) x %d prompts per step (%d in all); this run has "
      .. "%d rank(s) x %d = %d. The data order is global, so resume with %d prompts per step in all: the same "
      .. "number of ranks (mpirun -np %d), or per_device_train_batch_size x gradient_accumulation_steps x ranks = %d")
      :format(self.run_dir, w, g / w, g, self.dist.size, self.prompts_per_step, self.global_prompts_per_step, g, w, g), 0)
  end
  self.step = state.step
  self.sampler:restore(state.sampler)
  if state.async and not self.async then
    error(("--resume %s: its checkpoint was written with async_mode on (rows generated ahead); resume with the same async_mode"):format(self.run_dir), 0)
  end
  if self.async then self.async:restore(state.async) end
  self.stepper:restore({ optimizer_step = state.optimizer_step, tensors = state.tensors, baseline = state.baseline })
  self.bad_steps, self.reloads = state.bad_steps or 0, state.reloads or 0
  self.eval_history = state.eval_history
  self.train_seconds = state.train_seconds
  self:say(("resumed %s from %s (step %d)"):format(self.run_dir, self.resume_ckpt or "?", self.step))
end

function methods.save_checkpoint(self, why)
  self.step_world:check_same_weights(self.model, ("step %d"):format(self.step))
  local s = self:state()
  -- the Step says what to save (the policy, or a reward model's classifier folder)
  self.run:save_checkpoint(self.step, self.stepper:checkpoint_model(), s)
  self.last_saved = self.step
  if why then self:say(("checkpoint step-%d saved (%s)"):format(self.step, why)) end
end

-- The checkpoint a failing reward leaves behind (the state after the last finished step), and
-- the plots of the steps so far.
function methods.save_on_failure(self, why)
  if self.step > 0 and self.last_saved ~= self.step then
    local ok, err = pcall(self.save_checkpoint, self, why or "a reward failed")
    if not ok then io.stderr:write("remax: could not save a checkpoint: ", tostring(err), "\n") end
  end
  if self.step > 0 then self:draw_plots() end
end

-- The charts and index.html of the run. A failure is reported on stderr and kept in
-- self.plot_error (train() returns it); it never loses the run's other files.
function methods.draw_plots(self)
  local ok, err = pcall(self.run.plot, self.run)
  if not ok then
    self.plot_error = tostring(err)
    io.stderr:write(("remax: drawing the plots of %s failed: %s\n"):format(self.run_dir, self.plot_error))
  end
  return ok
end

-- Record a finished step: metrics, completions, evaluation, checkpoint.
function methods.finish_step(self, m, ro)
  local cfg = self.cfg
  self.step = self.step + 1
  self.sampler_before = nil
  -- an update the Step skipped (a non-finite loss or gradient norm): counted against max_bad_steps
  local bad = m.skipped and m or self.skipped_update
  self.skipped_update = nil
  if bad then
    self.bad_steps = self.bad_steps + 1
    self:say(("step %d: non-finite loss (%s) or gradient norm (%s): update skipped (%d of max_bad_steps = %d)"):format(
      self.step, tostring(bad.bad_loss), tostring(bad.bad_norm), self.bad_steps, cfg.max_bad_steps))
    m.bad_loss, m.bad_norm = nil, nil
  end
  m.loss = m.loss
  m.bad_steps, m.reloads = self.bad_steps, self.reloads
  m.peak_memory_mib = peak_memory_mib(self.model)
  m.train_memory_mib = self.stepper:memory_mib()
  if cfg.device == "cuda" then   -- the peak of device memory in tensors (remax's allocator)
    m.peak_device_memory_mib = require("remax.bind.tensor").cuda_memory().peak / 1048576
  end
  if self.pending_reloads then m.reloaded = self.pending_reloads; self.pending_reloads = nil end
  if self.eval_ds and ((cfg.eval_steps > 0 and self.step % cfg.eval_steps == 0) or self.step == cfg.max_steps) then
    local e = self:evaluate()
    m.eval_accuracy, m.eval_reward, m.eval_margin = e.accuracy, e.reward, e.margin
  end
  self.run:log_metrics(self.step, m)
  self.history[#self.history + 1] = m
  if ro and cfg.log_completions > 0 and self.step % cfg.log_completions == 0 then
    local list = self.stepper:completion_records(ro)
    for _, rec in ipairs(list) do rec.step = self.step end
    self.run:log_completions(self.step, list)
  end
  -- m.warning: the Step's word on this step (most episodes failed); a step that has one is shown
  if self.progress and (self.step % cfg.logging_steps == 0 or self.step == cfg.max_steps or m.warning) then
    local rewards = require("remax.step.rewards")
    local slow = rewards.is_slow(m.time_score, m.time_generate, rewards.limit(cfg.reward_timeout, m.time_generate))
    self.progress:update(self.step, { reward = m.reward, reward_greedy = m.reward_greedy, kl = m.kl,
      tokens_per_s = m.tokens_per_s, loss = m.loss,
      reward_slow = slow and m.time_score or nil, warning = m.warning })
  end
  if not self.quiet and not self.progress and (self.step % cfg.logging_steps == 0 or m.warning) then
    print(("step %d/%d  reward %.4f  loss %.4f  kl %.4f  grad_norm %.3f  lr %.2e%s"):format(self.step, cfg.max_steps,
      m.reward or 0, m.loss or 0, m.kl or 0, m.grad_norm or 0, m.lr or 0, m.warning and ("  " .. m.warning) or ""))
  end
  if self.bad_steps > cfg.max_bad_steps then
    self:save_checkpoint("too many bad steps")
    self:draw_plots()
    error(("stopping: %d steps had a non-finite loss or gradient (max_bad_steps = %d); last checkpoint %s"):format(
      self.bad_steps, cfg.max_bad_steps, self.run_dir), 0)
  end
  if cfg.save_steps > 0 and self.step % cfg.save_steps == 0 and self.step < cfg.max_steps then
    self:save_checkpoint()
  end
end

-- The whole run: evaluation before, steps (or the recipe's loop), evaluation after, checkpoint.
function methods.train(self, loop)
  -- issue 35: a new run that fails before its first step ends (a chat template that fails, a
  -- prompt longer than the model's positions) removes the folder it made, as a failed setup
  -- does; and the run folder's lock goes when the run ends (remax.run.folder)
  if not self.in_train then
    self.in_train = true
    local ok, out = xpcall(methods.train, guard.traceback, self, loop)   -- REMAX_DEBUG=1 keeps the traceback
    self.in_train = nil
    if not ok and self.fresh_run_dir and self.step == 0 and not self.last_saved and self.run and self.run.discard then
      pcall(self.run.discard, self.run)
    end
    if self.run and self.run.release then pcall(self.run.release, self.run) end
    if not ok then error(out, 0) end
    return out
  end
  local cfg = self.cfg
  if self.opts.signals ~= false then signals.install() end
  local okp, progress_mod = pcall(require, "remax.run.progress")
  if okp and not self.quiet then
    self.progress = progress_mod.new({ total = cfg.max_steps, label = self.run_name })
  end
  self:say(("run %s: %s, model %s (%d parameters), %d prompts per step, template %s"):format(self.run_dir,
    cfg.algo, self.model_source or "random init", self.model:num_parameters(), self.global_prompts_per_step, self.template_name))
  self:say(("dtype %s (%s)"):format(cfg.dtype, cfg.dtype_reason or ("set by " .. config.source(cfg, "dtype"))))
  self:say(require("remax.run.compute").describe(cfg.dtype, cfg.device))   -- GEMMs and threads
  if self.async and self.async.role then   -- rollout ranks (remax.run.rollout_ranks)
    self:say(("%d ranks (%s): rank 0 trains, %d generate and score; weights go to them every %d update(s)"):format(
      self.dist.size, self.dist.backend, cfg.rollout_ranks, cfg.weight_sync_steps))
  elseif self.dist.size > 1 then
    self:say(("%d ranks (%s), %d prompts each per step%s"):format(self.dist.size, self.dist.backend,
      self.prompts_per_step, cfg.hot_reload and "; hot reload is off with more than one rank" or ""))
  end
  local before
  if self.eval_ds and cfg.eval_on_start and self.step == 0 then
    before = self:evaluate()
    self.run:log_metrics(0, { eval_accuracy = before.accuracy, eval_reward = before.reward })
  end
  local interrupted = false
  local function one()
    self:check_reload()
    return self:train_step()
  end
  -- user code that calls os.exit (a recipe's loop or advantage function) stops the run as a
  -- failing reward does: with the checkpoint of the last finished step (remax.step.guard)
  -- Ctrl-C or SIGTERM while recipe code ran past remax.step.guard's grace: the unfinished step
  -- is dropped and the last finished one saved (with one rank; several stop, naming the step)
  local interrupt_what   -- what ran when Ctrl-C or SIGTERM stopped it (guard's Interrupt), said below
  local function guarded(f, ...)
    local ok, err = guard.pcall(f, ...)
    if ok then return false end
    if guard.is_interrupt(err) then
      if self.dist.size == 1 then interrupt_what = err.what; return true end
      error(("%s at step %d; resume from the last checkpoint"):format(tostring(err), self.step + 1), 0)
    end
    if guard.is_exit(err) and self.dist.size == 1 then self:save_on_failure("user code called os.exit") end
    error(err, 0)
  end
  if loop then
    interrupted = guarded(loop, self) or self.dist:any(signal_pending())
  else
    while self.step < cfg.max_steps and not self:out_of_time() do
      if guarded(one) or self.dist:any(signal_pending()) then interrupted = true break end
    end
  end
  local after = self.last_eval
  if not interrupted and self.eval_ds and (not after or after.step ~= self.step) then
    interrupted = guarded(function() after = self:evaluate() end)
    if not interrupted then
      self.run:log_metrics(self.step, { eval_accuracy = after.accuracy, eval_reward = after.reward,
        time_elapsed_train = self.train_seconds })
    end
  end
  if interrupted then
    self:save_checkpoint("interrupted")
    self:draw_plots()
    if self.progress then self.progress:finish() end
    self:say(("interrupted at step %d%s; resume with: remax run %s --resume %s"):format(self.step,
      interrupt_what and (" (stopped while " .. interrupt_what .. " ran; the unfinished step is dropped)") or "",
      self.recipe_path or "RECIPE.lua", self.run_dir))
    signals.clear()
    return { interrupted = true, step = self.step, run_dir = self.run_dir, plot_error = self.plot_error }
  end
  if self.last_saved ~= self.step then self:save_checkpoint() end
  if cfg.save_final_model and self.dist.is_root then
    self.stepper:save(cfg.save_final_model)
    self:say("final model saved to " .. cfg.save_final_model)
  end
  if cfg.save_merged then
    self.stepper:save_merged(cfg.save_merged)
    self:say("merged model saved to " .. cfg.save_merged)
  end
  if self.progress then self.progress:finish() end
  self:draw_plots()
  if after and not self.quiet then
    local first = self.eval_history and self.eval_history[1]
    print(("held-out %s: %.1f%% at step %d -> %.1f%% at step %d (%d %s)"):format(after.what or "greedy accuracy",
      100 * (first and first.accuracy or after.accuracy), first and first.step or self.step,
      100 * after.accuracy, self.step, after.n, after.what and "pairs" or "prompts"))
  end
  return { before = before, after = after, step = self.step, run_dir = self.run_dir, history = self.history,
    plot_error = self.plot_error }
end

-- For recipe loops: run one standard step (with hot reload) and say whether to go on.
function methods.should_continue(self)
  return self.step < self.cfg.max_steps and not self:out_of_time() and not self.dist:any(signal_pending())
end

-- max_time: the training time so far (steps only, evaluation excluded) has passed the budget
-- (on any rank: the ranks stop together).
function methods.out_of_time(self)
  local budget = self.cfg.max_time
  return self.dist:any(budget > 0 and (self.train_seconds or 0) >= budget)
end

-- One full step (RL or SFT): this rank's prompts to the Step, its metrics recorded.
function methods.train_step(self)
  local t0 = now()
  self.dist:set_step(self.step + 1)   -- named by a collective that times out (issue 35)
  local m, ro
  if self.async then m, ro = self.async:step(self.step + 1)   -- rows generated ahead (remax.run.async)
  else m, ro = self.stepper:run(self:next_batch(), { step = self.step + 1, first = self.batch_first }) end
  m.time_step = now() - t0
  self.train_seconds = (self.train_seconds or 0) + m.time_step
  m.time_elapsed_train = self.train_seconds
  self:finish_step(m, ro)
  return m
end

-- Held-out evaluation now (the Step's), kept in the run's history and said.
function methods.evaluate(self, opts)
  if not self.eval_ds then return {} end
  local e = self.stepper:evaluate(self.eval_ds.rows, opts)
  e.step = self.step
  self.eval_seconds = (self.eval_seconds or 0) + e.seconds
  self.last_eval = e
  self.eval_history = self.eval_history or {}
  table.insert(self.eval_history, { step = self.step, accuracy = e.accuracy, reward = e.reward })
  self:say(("eval at step %d: %s %.1f%%, reward %.4f (%d held-out %s, %.1fs)"):format(self.step,
    e.what or ("greedy " .. (self.accuracy_name or "accuracy")), 100 * e.accuracy, e.reward, e.n,
    e.what and "pairs" or "prompts", e.seconds))
  return e
end

-- Hot reload between steps (remax.run.reload): changed reward files and the recipe.
function methods.check_reload(self) return reload.check(self) end

-- For recipe loops (docs/trainer.md, "Driving the steps yourself"): the Step's pieces with the
-- Run's step number filled in. A loop may also call run.stepper's methods directly.
function methods.rollout(self, rows, opts)
  opts = opts or {}
  if opts.step == nil or opts.first == nil then
    local o = { step = self.step + 1, first = self.batch_first }
    for k, v in pairs(opts) do o[k] = v end
    opts = o
  end
  return self.stepper:rollout(rows, opts)
end
function methods.score(self, ro, opts) return self.stepper:score(ro, opts) end
function methods.advantage(self, ro) return self.stepper:advantage(ro) end
function methods.update(self, ro)
  if ro.step == nil then ro.step = self.step + 1 end
  local up = self.stepper:update(ro)
  if not up.finite then self.skipped_update = up end   -- finish_step counts it
  return up
end
function methods.rl_metrics(self, ro, up) return self.stepper:rl_metrics(ro, up) end

return M
