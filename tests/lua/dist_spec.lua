-- Data parallel training (remax.bind.dist, engine/dist/). In-process checks run in a world of one;
-- the rest start `mpirun -np 2` on the CPU and compare with one process on the same global batch.
-- They skip, saying why, when mpirun or the MPI backend (libremax_mpi.so) is not there.
local ffi = require("ffi")
pcall(ffi.cdef, "int memcmp(const void *a, const void *b, size_t n);")
local dist = require("remax.bind.dist")
local cli = require("remax.cli.main")

local support = require("support")
local tmpdir, write = support.tmpdir, support.write

local read = support.try_read

local function exists(path) return read(path) ~= nil end

describe("dist in a world of one", function()
  it("is rank 0 of 1 without a launcher and loads no MPI library", function()
    local w = dist.world()
    assert.are.equal(0, w.rank)
    assert.are.equal(1, w.size)
    assert.is_true(w.is_root)
    assert.are.equal("single", w.backend)
    assert.is_nil((read("/proc/self/maps") or ""):find("libmpi", 1, true))
    -- collectives return their input
    assert.are.same({ 3, 4.5 }, { w:sum(3, 4.5) })
    assert.are.same({ { a = 1 } }, w:gather({ a = 1 }))
    assert.are.same({ x = "y" }, w:broadcast({ x = "y" }))
    assert.is_true(w:any(true))
    assert.is_false(w:any(false))
    local ok, msg = w:agree(false, "boom")
    assert.is_false(ok)
    assert.are.equal("boom", msg)
  end)

  it("libremax and the remax program do not link libmpi", function()
    local bdir = cli.build_dir()
    for _, f in ipairs({ bdir .. "/libremax.so", bdir .. "/remax" }) do
      local p = assert(io.popen("ldd " .. f .. " 2>&1"))
      local out = p:read("*a")
      p:close()
      assert.is_nil(out:find("libmpi", 1, true), f .. " links libmpi:\n" .. out)
    end
  end)

  it("splits n items into contiguous shares that cover 1..n once", function()
    for _, size in ipairs({ 1, 2, 3, 5 }) do
      for _, n in ipairs({ 0, 1, 4, 7, 12 }) do
        local next_first = 1
        for rank = 0, size - 1 do
          local w = setmetatable({ rank = rank, size = size }, dist.World)
          local first, last = w:share_range(n)
          assert.are.equal(next_first, first)
          local count = last - first + 1
          assert.is_true(count == math.floor(n / size) or count == math.floor(n / size) + 1)
          next_first = last + 1
        end
        assert.are.equal(n + 1, next_first)
      end
    end
  end)

  it("sends Lua values exactly", function()
    local v = { 0.1, 1 / 3, -0.0, 1e300, math.huge, -math.huge, "a\0b\n\"\\\255", true, false,
      nested = { x = { 1, 2, { y = "z" } } }, [20] = 2 ^ 60, [21] = 123456789012345 }
    local back = dist.decode(dist.encode(v))
    for i = 1, 8 do assert.are.equal(v[i], back[i]) end
    assert.is_false(back[9])
    assert.are.equal(1 / v[3], 1 / back[3])   -- -0 stays -0
    assert.are.equal(v[20], back[20])
    assert.are.equal(v[21], back[21])
    assert.are.same(v.nested, back.nested)
    local nan = dist.decode(dist.encode({ 0 / 0 }))[1]
    assert.is_true(nan ~= nan)
    assert.has_error(function() dist.encode({ print }) end, "dist: cannot send a function to another rank")
  end)

  it("rejects a REMAX_DIST value it does not know, naming it", function()
    local dir = tmpdir()
    write(dir .. "/probe.lua", 'local w = require("remax.bind.dist").world() print("world", w.rank, w.size, w.backend)')
    local p = assert(io.popen(("REMAX_DIST=bogus %s/remax run %s/probe.lua 2>&1; echo rc=$?"):format(cli.build_dir(), dir)))
    local out = p:read("*a")
    p:close()
    assert.is_truthy(out:find("REMAX_DIST=bogus: expected auto (the default), mpi or off", 1, true), out)
    assert.is_nil(out:find("rc=0", 1, true))
    p = assert(io.popen(("REMAX_DIST=off OMPI_COMM_WORLD_SIZE=2 %s/remax run %s/probe.lua 2>&1"):format(cli.build_dir(), dir)))
    out = p:read("*a")
    p:close()
    assert.is_truthy(out:find("world\t0\t1\tsingle"), out)
  end)
end)

describe("ZeRO in a world of one", function()
  local remax = require("remax")
  local optim = require("remax.bind.optim")
  local tensor = require("remax.bind.tensor")
  local function tiny()
    return support.tiny_model({ vocab_size = 50, hidden_size = 16, intermediate_size = 40, num_attention_heads = 2,
      num_key_value_heads = 1, max_position_embeddings = 64, tie_word_embeddings = false })
  end

  it("cuts a flat buffer into equal aligned shards that cover it once", function()
    for _, size in ipairs({ 1, 2, 3, 4, 8 }) do
      for _, n in ipairs({ 1, 63, 64, 1000, 6544, 123457 }) do
        local at = 0
        for rank = 0, size - 1 do
          local w = setmetatable({ rank = rank, size = size }, dist.World)
          local shard = w:shard_size(n)
          assert.are.equal(0, shard % dist.SHARD_ALIGN)
          assert.is_true(shard * size >= n)
          local lo, hi = w:shard_range(n, shard)
          assert.are.equal(at, lo)
          assert.is_true(hi - lo <= shard)
          at = hi
        end
        assert.are.equal(n, at)
      end
    end
  end)

  it("sees a model's parameters as one flat arena, padding included", function()
    local m = remax.model.new(tiny(), { seed = 1 })
    local list = {}
    for i = 1, #m.names do list[i] = m:param(m.names[i]) end
    local flat = dist.flat(list, "params")
    -- every tensor inside the view, none overlapping another, the view ending at the last one's end
    local lowest, ends = math.huge, 0
    for i = 1, #list do
      lowest = math.min(lowest, flat.offsets[i])
      ends = math.max(ends, flat.offsets[i] + tonumber(list[i].numel))
      for j = 1, #list do
        if j ~= i then
          local a, b = flat.offsets[i], flat.offsets[j]
          assert.is_true(a + tonumber(list[i].numel) <= b or b + tonumber(list[j].numel) <= a)
        end
      end
    end
    assert.are.equal(0, lowest)
    assert.are.equal(ends, tonumber(flat.view.numel))
    -- the order of the list does not matter; an overlap does
    local reversed = dist.flat({ list[2], list[1] }, "params")
    local lo = math.min(flat.offsets[1], flat.offsets[2])
    assert.are.same({ flat.offsets[2] - lo, flat.offsets[1] - lo }, reversed.offsets)
    assert.has_error(function() dist.flat({ list[1], list[1] }, "params") end,
      "dist: params: tensor 2 overlaps tensor 1 (ZeRO shards the arena as one buffer)")
  end)

  -- the sharded optimizer in a world of one owns every shard: it must take AdamW's steps bit for bit
  for _, stage in ipairs({ 1, 2 }) do
    it(("takes AdamW's steps bit for bit, clipping included (stage %d)"):format(stage), function()
      local a, b = remax.model.new(tiny(), { seed = 3 }), remax.model.new(tiny(), { seed = 3 })
      local opts = { lr = 1e-2, weight_decay = 0.1, stage = stage }
      local pa, ga = a:trainable()
      local oa = optim.adamw(pa, ga, opts)
      local ob = optim.zero_adamw(dist.world(), b, opts)
      local _, gb = b:trainable()
      for step = 1, 3 do
        for i, name in ipairs(a.names) do
          ga[name]:normal_(step, i * 4096, 0, 0.5)
          gb[name]:normal_(step, i * 4096, 0, 0.5)
        end
        local na = optim.clip_grad_norm(ga, 1.0)
        local nb = ob:reduce_grads(1.0)
        assert.is_true(na > 1)   -- clipping happened
        assert.is_true(math.abs(na - nb) <= 1e-12 * na)
        oa:step()
        ob:step()
      end
      local sa, sb = oa:state(), ob:state()
      for i, name in ipairs(a.names) do
        local x, y = pa[name], b:param(name)
        assert.are.equal(0, ffi.C.memcmp(x.data, y.data, tonumber(x.numel) * 4), name)
        for _, which in ipairs({ "m", "v" }) do
          local u, v = sa.tensors[which .. "." .. name], sb.tensors[which .. "." .. name]
          assert.are.equal(0, ffi.C.memcmp(u.data, v.data, tonumber(u.numel) * 4), which .. "." .. name)
        end
      end
      -- and its state loads back into a fresh one
      local oc = optim.zero_adamw(dist.world(), b, opts)
      oc:load_state(sb)
      assert.are.equal(3, oc.step_count)
      assert.are.equal(0, ffi.C.memcmp(oc.m_flat.data, ob.m_flat.data, tonumber(ob.m_flat.numel) * 4))
    end)
  end

  it("checks a flat buffer before any collective, naming what is wrong", function()
    local C = require("remax.bind.ffi").C
    local function err(rc) assert.are_not.equal(0, rc); return ffi.string(C.rx_last_error()) end
    local t = tensor.new({ 1000 }, "f32")
    t:fill_(2)
    -- a world of one owns the one shard: nothing moves
    assert.are.equal(0, C.rx_dist_reduce_scatter(t, 1024))
    assert.are.equal(0, C.rx_dist_allgather(t, 1000))
    assert.are.equal(0, C.rx_dist_broadcast_tensor(t, 0))
    assert.are.equal(2, t:get(1000))
    assert.are.equal("rx_dist_reduce_scatter: 1 shards of 999 elements do not cover 1000 elements", err(C.rx_dist_reduce_scatter(t, 999)))
    assert.are.equal("rx_dist_allgather: the flat buffer is i32 (f32 or f64; bf16 on cuda)",
      err(C.rx_dist_allgather(tensor.new({ 8 }, "i32"), 8)))
    assert.are.equal("rx_dist_reduce_scatter: the flat buffer is NULL", err(C.rx_dist_reduce_scatter(nil, 8)))
    assert.are.equal("rx_dist_broadcast_tensor: root 1 outside 0..0", err(C.rx_dist_broadcast_tensor(t, 1)))
  end)

  it("rejects a zero_stage other than 0, 1 or 2, naming it", function()
    local config = require("remax.settings.config")
    assert.has_error(function() config.resolve({ zero_stage = 3 }) end)
    local ok, err = pcall(config.resolve, { zero_stage = 3 })
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("zero_stage = 3: expected an integer in [0, 2]", 1, true), tostring(err))
  end)
end)

---------------------------------------------------------------------------- two processes

local skip = support.mpi_missing()
if skip then print("dist_spec: skipping the mpirun tests: " .. skip) end

local REWARD = [[
-- the fraction of lowercase ASCII letters; FAIL_RANK / KILL_RANK make one rank fail at its call N
local ffi = require("ffi")
pcall(ffi.cdef, "int getpid(void); int kill(int pid, int sig);")
local calls = 0
return { name = "lower", fn = function(completions, batch)
  calls = calls + 1
  local rank = os.getenv("OMPI_COMM_WORLD_RANK")
  if rank and rank == os.getenv("FAIL_RANK") and calls == tonumber(os.getenv("FAIL_CALL")) then
    error("made to fail on rank " .. rank)
  end
  if rank and rank == os.getenv("KILL_RANK") and calls == tonumber(os.getenv("FAIL_CALL")) then
    local f = io.open(os.getenv("KILL_STAMP"), "w"); f:write(os.time()); f:close()
    ffi.C.kill(ffi.C.getpid(), 9)
  end
  local s = {}
  for i = 1, #completions do
    local ids, n = batch.completion_ids[i], 0
    for _, id in ipairs(ids) do if id >= 97 and id <= 122 then n = n + 1 end end
    s[i] = n / math.max(#ids, 1)
  end
  return s
end }
]]

local function recipe(dir)
  write(dir .. "/lower.lua", REWARD)
  support.prompts(dir .. "/p.jsonl", 24)
  write(dir .. "/r.lua", ([[
return {
  model_config = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 16, intermediate_size = 32,
    num_hidden_layers = 1, num_attention_heads = 2, num_key_value_heads = 1, max_position_embeddings = 128,
    rope_theta = 10000, rms_norm_eps = 1e-6, tie_word_embeddings = true },
  data = %q, rewards = { %q }, chat_template = "plain", hot_reload = false,
  num_generations = 2, max_completion_length = 6, learning_rate = 1e-2, max_steps = 3, eval_size = 0,
  save_steps = 0, log_completions = 1, seed = 7, output_dir = %q, dtype = "f32",
}
]]):format(dir .. "/p.jsonl", dir .. "/lower.lua", dir .. "/runs"))
  return dir .. "/r.lua"
end

-- Runs remax (under mpirun -np ranks when ranks > 1); returns output, exit code.
local function remax(ranks, args, env)
  return support.run_remax(ranks, args, env, { "FAIL_RANK", "FAIL_CALL", "KILL_RANK", "KILL_STAMP" })
end
local jsonl, compare_weights = support.jsonl, support.compare_weights

local function same_rollouts(one, two)
  local a, b = jsonl(one .. "/completions.jsonl"), jsonl(two .. "/completions.jsonl")
  assert.are.equal(#a, #b)
  assert.is_true(#a > 0)
  for i = 1, #a do
    assert.are.equal(a[i].prompt, b[i].prompt)
    assert.are.equal(a[i].completion, b[i].completion)
    assert.are.equal(a[i].reward, b[i].reward)
  end
  local ma, mb = jsonl(one .. "/metrics.jsonl"), jsonl(two .. "/metrics.jsonl")
  assert.are.equal(#ma, #mb)
  for i = 1, #ma do
    assert.are.equal(ma[i].reward, mb[i].reward)
    assert.are.equal(ma[i].completion_length_mean, mb[i].completion_length_mean)
  end
end

local describe_mpi = skip and pending or describe

describe_mpi("mpirun -np 2 on the CPU", function()
  local dir, rfile
  setup(function()
    dir = tmpdir()
    rfile = recipe(dir)
  end)

  it("is a world of one over MPI with REMAX_DIST=mpi and no launcher", function()
    write(dir .. "/probe.lua", 'local w = require("remax.bind.dist").world() print("world", w.rank, w.size, w.backend)')
    local out, rc = remax(1, ("run %s/probe.lua"):format(dir), "REMAX_DIST=mpi")
    assert.are.equal(0, rc, out)
    assert.is_truthy(out:find("world\t0\t1\tmpi %("), out)
    out, rc = remax(2, ("run %s/probe.lua"):format(dir))
    assert.are.equal(0, rc, out)
    assert.is_truthy(out:find("world\t0\t2\tmpi", 1), out)
    assert.is_truthy(out:find("world\t1\t2\tmpi", 1), out)
  end)

  -- 2 ranks x 4 prompts against 1 rank x 4 prompts x 2 accumulation steps: the same 8 prompts,
  -- the same micro-batches, so the same completions and (up to summation order) the same weights.
  local cases = {
    { name = "remax", args = "--algo remax" },
    { name = "grpo", args = "--algo grpo --generate_greedy false --num_generations 3" },
    { name = "beta", args = "--algo remax --beta 0.1" },
  }
  for _, case in ipairs(cases) do
    it(("trains like one process on the same global batch (%s)"):format(case.name), function()
      local out1, rc1 = remax(1, ("run %s %s --per_device_train_batch_size 4 --gradient_accumulation_steps 2 --run_name one-%s")
        :format(rfile, case.args, case.name))
      assert.are.equal(0, rc1, out1)
      local out2, rc2 = remax(2, ("run %s %s --per_device_train_batch_size 4 --run_name two-%s")
        :format(rfile, case.args, case.name))
      assert.are.equal(0, rc2, out2)
      local one, two = dir .. "/runs/one-" .. case.name, dir .. "/runs/two-" .. case.name
      same_rollouts(one, two)
      local worst, bits = compare_weights(one .. "/checkpoints/step-3", two .. "/checkpoints/step-3")
      print(("dist_spec %s: final weights %s (largest relative difference %.3g)"):format(case.name,
        bits and "bit-identical" or "differ in low bits", worst))
      -- two ranks' all-reduce adds the same two micro-batch gradients one process adds: same bits
      assert.is_true(bits, ("weights differ: largest relative difference %g"):format(worst))
    end)
  end

  it("has rank 0 alone write the run folder and print progress", function()
    local out, rc = remax(2, ("run %s --per_device_train_batch_size 4 --run_name solo --max_steps 1"):format(rfile))
    assert.are.equal(0, rc, out)
    local _, runs = out:gsub("run [^\n]*/runs/solo: remax", "")
    assert.are.equal(1, runs, out)
    local p = assert(io.popen("ls " .. dir .. "/runs"))
    local listing = p:read("*a")
    p:close()
    assert.is_truthy(listing:find("solo", 1, true))
    assert.is_nil(listing:find("solo-", 1, true))   -- no second folder from another rank's clock
    assert.is_true(exists(dir .. "/runs/solo/checkpoints/step-1/trainer_state.json"))
    local m = jsonl(dir .. "/runs/solo/metrics.jsonl")
    assert.are.equal(1, #m)
    -- the logs cover the 8 prompts of both ranks: 2 sampled rows and 1 greedy row each
    assert.are.equal(8 * 3, #jsonl(dir .. "/runs/solo/completions.jsonl"))
  end)

  it("resumes with the same global batch and refuses another one", function()
    local out, rc = remax(1, ("run %s --per_device_train_batch_size 4 --resume %s/runs/two-remax --max_steps 4")
      :format(rfile, dir))
    assert.are_not.equal(0, rc)
    assert.is_truthy(out:find("2 rank(s) x 4 prompts per step (8 in all)", 1, true), out)
    assert.is_truthy(out:find("mpirun -np 2", 1, true), out)
    -- 1 rank x 4 x 2 accumulation steps is the same global batch: the data order is global
    out, rc = remax(1, ("run %s --per_device_train_batch_size 4 --gradient_accumulation_steps 2 --resume %s/runs/two-remax --max_steps 4")
      :format(rfile, dir))
    assert.are.equal(0, rc, out)
    assert.is_true(exists(dir .. "/runs/two-remax/checkpoints/step-4/trainer_state.json"))
    -- and two ranks resume a two-rank run
    out, rc = remax(2, ("run %s --per_device_train_batch_size 4 --resume %s/runs/two-grpo --algo grpo --generate_greedy false --num_generations 3 --max_steps 4")
      :format(rfile, dir))
    assert.are.equal(0, rc, out)
    assert.is_true(exists(dir .. "/runs/two-grpo/checkpoints/step-4/trainer_state.json"))
  end)

  it("stops every rank when a reward fails on one, after rank 0 saves the last step", function()
    local out, rc = remax(2, ("run %s --per_device_train_batch_size 4 --run_name fail --max_steps 5"):format(rfile),
      "FAIL_RANK=1 FAIL_CALL=3")   -- call 1 is the reward check at setup, 3 is step 2
    assert.are_not.equal(0, rc)
    assert.is_truthy(out:find("remax (rank 0 of 2): reward 'lower'", 1, true), out)
    assert.is_truthy(out:find("remax (rank 1 of 2): reward 'lower'", 1, true), out)
    assert.is_truthy(out:find("made to fail on rank 1", 1, true), out)
    assert.is_true(exists(dir .. "/runs/fail/checkpoints/step-1/trainer_state.json"))
  end)

  it("saves and stops on Ctrl-C to mpirun, given the ranks time to save", function()
    local log, pidfile = dir .. "/ctrlc.log", dir .. "/ctrlc.pid"
    -- Open MPI sends SIGTERM to the ranks, then SIGKILL after odls_base_sigkill_timeout seconds
    local cmd = ("(exec env OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none "
      .. "OMPI_MCA_odls_base_sigkill_timeout=20 mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS "
      .. "%s/remax run %s --per_device_train_batch_size 4 --run_name ctrlc --max_steps 100000 >%s 2>&1) & echo $! >%s")
      :format(cli.build_dir(), rfile, log, pidfile)
    assert.is_true(os.execute(cmd) == 0)
    local pid = tonumber(read(pidfile))
    local metrics = dir .. "/runs/ctrlc/metrics.jsonl"
    local t0 = os.time()
    while #jsonl(metrics) < 2 and os.time() - t0 < 300 do os.execute("sleep 0.5") end
    assert.is_true(#jsonl(metrics) >= 2, "the run did not start: " .. (read(log) or ""))
    os.execute("kill -INT " .. pid)   -- what Ctrl-C sends
    t0 = os.time()
    -- running: not gone and not a zombie (the launcher's parent shell has exited; nobody reaps it)
    local function running()
      local st = read("/proc/" .. pid .. "/status")
      return st ~= nil and not st:find("State:%s*Z")
    end
    while running() and os.time() - t0 < 120 do os.execute("sleep 0.5") end
    local alive = running()
    if alive then os.execute("kill -9 " .. pid) end
    assert.is_false(alive, "mpirun still ran 120 s after Ctrl-C")
    -- rank 0 saved the last finished step (mpirun may drop the ranks' last output lines, so the
    -- checkpoint is what counts)
    local steps = #jsonl(metrics)
    local ckpt = ("%s/runs/ctrlc/checkpoints/step-%d/trainer_state.json"):format(dir, steps)
    assert.is_true(exists(ckpt), ckpt .. " is missing; output:\n" .. (read(log) or ""))
  end)

  it("ends the other rank within a minute when one is killed", function()
    local stamp = dir .. "/killed"
    local out, rc = remax(2, ("run %s --per_device_train_batch_size 4 --run_name killed --max_steps 50"):format(rfile),
      "KILL_RANK=1 FAIL_CALL=3 KILL_STAMP=" .. stamp)
    local ended = os.time()
    assert.are_not.equal(0, rc)
    local killed_at = tonumber(read(stamp))
    assert.is_truthy(killed_at, out)
    assert.is_true(ended - killed_at <= 60, ("the run went on %d s after rank 1 died"):format(ended - killed_at))
  end)
end)

-- ZeRO-1/2 against no sharding, at 2 and 4 ranks. The ranks' gradients are summed in rank
-- order by every stage (engine/dist/mpi/mpi_backend.c), so all must agree bit for bit: the
-- final weights and AdamW's moments.
describe_mpi("ZeRO under mpirun", function()
  local dir, rfile
  setup(function()
    dir = tmpdir()
    rfile = recipe(dir)
  end)

  local function ckpt(name, step) return ("%s/runs/%s/checkpoints/step-%d"):format(dir, name, step) end

  local function assert_same_checkpoints(a, b, weights)
    for _, file in ipairs({ weights, "trainer_state.safetensors" }) do
      local worst, bits = compare_weights(a .. "/" .. file, b .. "/" .. file)
      assert.is_true(bits, ("%s of %s and %s differ: largest relative difference %g"):format(file, a, b, worst))
    end
  end

  local cases = {
    { name = "remax", args = "--algo remax", weights = "model.safetensors" },
    { name = "grpo", args = "--algo grpo --generate_greedy false --num_generations 3", weights = "model.safetensors" },
    { name = "lora", args = "--algo remax --use_lora true --lora_r 2", weights = "adapter_model.safetensors" },
  }
  -- bf16 mixed precision: AdamW rounds each rank's shard of the working copy in the same pass, and
  -- the all-gather of the masters makes the next forward convert them all (engine/core's mirrors):
  -- a rank that kept the other shards' stale copy would drift from stage 0
  local bf16 = { name = "bf16", args = "--algo remax --dtype bf16", weights = "model.safetensors" }
  for _, ranks in ipairs({ 2, 4 }) do
    for _, case in ipairs(ranks == 2 and { cases[1], cases[2], cases[3], bf16 } or cases) do
      it(("stages 1 and 2 train as stage 0 does, bit for bit (%s, %d ranks)"):format(case.name, ranks), function()
        local per = 8 / ranks   -- 8 prompts per step in all
        for stage = 0, 2 do
          local out, rc = remax(ranks, ("run %s %s --per_device_train_batch_size %d --zero_stage %d --run_name z%d-%s-%d")
            :format(rfile, case.args, per, stage, stage, case.name, ranks))
          assert.are.equal(0, rc, out)
        end
        local base = ckpt(("z0-%s-%d"):format(case.name, ranks), 3)
        for stage = 1, 2 do
          local other = ckpt(("z%d-%s-%d"):format(stage, case.name, ranks), 3)
          same_rollouts(base:gsub("/checkpoints/step%-3$", ""), other:gsub("/checkpoints/step%-3$", ""))
          assert_same_checkpoints(base, other, case.weights)
        end
      end)
    end
  end

  it("reduce-scatters and all-gathers a flat buffer in rank order, across chunks and short shards", function()
    -- 3 ranks, 9 million f32 elements: more than two of the backend's 4M-element chunks per
    -- shard, and a last shard shorter than the others
    write(dir .. "/rs.lua", [[
      local ffi = require("ffi")
      local dist = require("remax.bind.dist")
      local tensor = require("remax.bind.tensor")
      local w = dist.world()
      local n = 9000001
      local function value(r, i) return ((i * 7919 + r * 104729) % 100003) / 1024 + r / 3 end
      local t = tensor.new({ n }, "f32")
      local x = ffi.cast("float*", t.data)
      for i = 0, n - 1 do x[i] = value(w.rank, i) end
      local shard = w:shard_size(n)
      w:reduce_scatter(t, shard)
      local lo, hi = w:shard_range(n, shard)
      local f, g = ffi.new("float[1]"), ffi.new("float[1]")
      local function expected(i)   -- f32 adds, in rank order
        f[0] = value(0, i)
        for r = 1, w.size - 1 do
          g[0] = value(r, i)
          f[0] = f[0] + g[0]
        end
        return f[0]
      end
      local bad = 0
      for i = lo, hi - 1 do if x[i] ~= expected(i) then bad = bad + 1 end end
      w:allgather(t, shard)
      local gathered_bad = 0
      for i = 0, n - 1 do if x[i] ~= expected(i) then gathered_bad = gathered_bad + 1 end end
      print(("rank %d shard [%d, %d) wrong after reduce-scatter %d, after all-gather %d"):format(w.rank, lo, hi, bad, gathered_bad))
    ]])
    local out, rc = remax(3, ("run %s/rs.lua"):format(dir))
    assert.are.equal(0, rc, out)
    for r = 0, 2 do
      assert.is_truthy(out:find(("rank %d shard %%[%%d+, %%d+%%) wrong after reduce%%-scatter 0, after all%%-gather 0"):format(r)), out)
    end
    assert.is_truthy(out:find("rank 2 shard [6000128, 9000001)", 1, true), out)   -- the short one
  end)

  it("resumes bit for bit, with the same ranks and re-sharded onto another number", function()
    local common = ("run %s --zero_stage 2"):format(rfile)
    local out, rc = remax(2, common .. " --per_device_train_batch_size 4 --max_steps 4 --run_name zr-whole")
    assert.are.equal(0, rc, out)
    -- 2 steps, then 2 more on the same 2 ranks
    out, rc = remax(2, common .. " --per_device_train_batch_size 4 --max_steps 2 --run_name zr-same")
    assert.are.equal(0, rc, out)
    out, rc = remax(2, ("%s --per_device_train_batch_size 4 --max_steps 4 --resume %s/runs/zr-same"):format(common, dir))
    assert.are.equal(0, rc, out)
    assert_same_checkpoints(ckpt("zr-whole", 4), ckpt("zr-same", 4), "model.safetensors")
    -- Re-sharded: 4 ranks x 2 prompts throughout, against 2 steps of ZeRO-1 on 4 ranks, a third
    -- step of ZeRO-2 in one process (one shard) and a fourth on 4 ranks again. One process adding
    -- 4 micro-batches of 2 prompts in turn sums as 4 ranks do, so the bits must agree.
    out, rc = remax(4, common .. " --per_device_train_batch_size 2 --max_steps 4 --run_name zr-four")
    assert.are.equal(0, rc, out)
    out, rc = remax(4, ("run %s --zero_stage 1 --per_device_train_batch_size 2 --max_steps 2 --run_name zr-moved"):format(rfile))
    assert.are.equal(0, rc, out)
    out, rc = remax(1, ("%s --per_device_train_batch_size 2 --gradient_accumulation_steps 4 --max_steps 3 --resume %s/runs/zr-moved")
      :format(common, dir))
    assert.are.equal(0, rc, out)
    -- a resume keeps the run's own settings (the last resume's 4 micro-batches) unless told again
    out, rc = remax(4, ("%s --per_device_train_batch_size 2 --gradient_accumulation_steps 1 --max_steps 4 --resume %s/runs/zr-moved")
      :format(common, dir))
    assert.are.equal(0, rc, out)
    assert_same_checkpoints(ckpt("zr-four", 4), ckpt("zr-moved", 4), "model.safetensors")
  end)

  -- rank 0 alone reads the checkpoint: the adapters and their dropout counter must reach the
  -- other ranks (without them rank 1 trained its freshly initialised adapters)
  for _, stage in ipairs({ 0, 2 }) do
    it(("resumes a LoRA run on 2 ranks bit for bit (zero_stage %d)"):format(stage), function()
      local common = ("run %s --use_lora true --lora_r 2 --zero_stage %d --per_device_train_batch_size 4"):format(rfile, stage)
      local out, rc = remax(2, ("%s --max_steps 3 --run_name zl%d-whole"):format(common, stage))
      assert.are.equal(0, rc, out)
      out, rc = remax(2, ("%s --max_steps 2 --run_name zl%d-resumed"):format(common, stage))
      assert.are.equal(0, rc, out)
      out, rc = remax(2, ("%s --max_steps 3 --resume %s/runs/zl%d-resumed"):format(common, dir, stage))
      assert.are.equal(0, rc, out)
      assert_same_checkpoints(ckpt(("zl%d-whole"):format(stage), 3), ckpt(("zl%d-resumed"):format(stage), 3),
        "adapter_model.safetensors")
    end)
  end

  it("stops both ranks when one is killed, keeping the last finished step, which resumes", function()
    local stamp = dir .. "/zkilled"
    local out, rc = remax(2, ("run %s --zero_stage 2 --per_device_train_batch_size 4 --save_steps 1 --max_steps 4 --run_name zr-killed")
      :format(rfile), "KILL_RANK=1 FAIL_CALL=3 KILL_STAMP=" .. stamp)   -- killed in step 2
    local ended = os.time()
    assert.are_not.equal(0, rc)
    local killed_at = tonumber(read(stamp))
    assert.is_truthy(killed_at, out)
    assert.is_true(ended - killed_at <= 60, ("the run went on %d s after rank 1 died"):format(ended - killed_at))
    assert.is_true(exists(ckpt("zr-killed", 1) .. "/trainer_state.json"), out)
    assert.is_false(exists(ckpt("zr-killed", 2) .. "/trainer_state.json"))
    out, rc = remax(2, ("run %s --zero_stage 2 --per_device_train_batch_size 4 --max_steps 4 --resume %s/runs/zr-killed")
      :format(rfile, dir))
    assert.are.equal(0, rc, out)
    assert_same_checkpoints(ckpt("zr-whole", 4), ckpt("zr-killed", 4), "model.safetensors")
  end)
end)

---------------------------------------------------------------------------- NCCL

-- The NCCL path of the same collectives, and ZeRO-2 on CUDA tensors: with this build when it has
-- a CUDA device, else with the CUDA emulator's build (build-emu, as ./remax test runs its GPU
-- tests: cmake -S . -B build-emu -DRX_CUDA=emulate), whose libremax_mpi.so is built against the
-- emulator's one-rank NCCL.
local function nccl_build()
  if skip then return nil, skip end
  if require("remax.bind.tensor").has_cuda() then return cli.build_dir() end
  local emu = os.getenv("REMAX_EMU_BUILD_DIR") or (require("remax.bind.ffi").home .. "/build-emu")
  if exists(emu .. "/libremax_mpi.so") and exists(emu .. "/remax") then return emu end
  return nil, "no CUDA device here and no emulator build with its MPI plugin (cmake -S . -B build-emu "
    .. "-DRX_CUDA=emulate; cmake --build build-emu)"
end
local nccl_dir, nccl_skip = nccl_build()
if nccl_skip then print("dist_spec: skipping the NCCL test: " .. nccl_skip) end

;(nccl_skip and pending or describe)("NCCL behind the same interface", function()
  it("reduce-scatters, all-gathers, broadcasts and steps ZeRO-2 on CUDA tensors as the CPU does", function()
    local cmd = ("REMAX_DIST=mpi OMP_NUM_THREADS=1 REMAX_BUILD_DIR=%s %s/remax run %s/tests/lua/nccl_probe.lua 2>&1; echo \"rc=$?\"")
      :format(nccl_dir, nccl_dir, require("remax.bind.ffi").home)
    local p = assert(io.popen(cmd))
    local out = p:read("*a")
    p:close()
    print(("dist_spec: NCCL probe with %s: %s"):format(nccl_dir, out:match("nccl probe ok") or "failed"))
    assert.are.equal(0, tonumber(out:match("rc=(%d+)%s*$")), out)
    assert.is_truthy(out:find("nccl probe ok", 1, true), out)
  end)
end)

---------------------------------------------------------------------------- Slurm

-- A one-node Slurm cluster on this machine (tests/slurm/cluster.sh: munged, slurmctld and slurmd
-- with their files in a temporary folder), and `srun -n 2` against one process.
local function slurm_missing()
  if skip then return skip end
  for _, c in ipairs({ "munged", "slurmctld", "slurmd", "srun", "sinfo" }) do
    if os.execute("command -v " .. c .. " >/dev/null 2>&1") ~= 0 then
      return c .. " is not installed (apt-get install slurm-wlm munge)"
    end
  end
  return nil
end
local slurm_skip = slurm_missing()
if slurm_skip then print("dist_spec: skipping the srun test: " .. slurm_skip) end

;(slurm_skip and pending or describe)("srun on a one-node Slurm cluster", function()
  local dir, rfile, cluster, why
  local home = require("remax.bind.ffi").home
  setup(function()
    dir = tmpdir()
    rfile = recipe(dir)
    cluster = dir .. "/slurm"
    os.execute("mkdir -p " .. cluster)
    local p = assert(io.popen(("%s/tests/slurm/cluster.sh start %s 2>&1"):format(home, cluster)))
    local out = p:read("*a")
    p:close()
    if not out:find("^ready") then
      why = out:gsub("%s+$", "")
      print("dist_spec: skipping the srun test: Slurm did not start here: " .. why)
    end
  end)
  teardown(function()
    if cluster then os.execute(("%s/tests/slurm/cluster.sh stop %s"):format(home, cluster)) end
  end)

  it("trains with srun -n 2 as one process does on the same global batch (ZeRO-2)", function()
    if why then return end   -- said in setup, once
    local out1, rc1 = remax(1, ("run %s --per_device_train_batch_size 4 --gradient_accumulation_steps 2 --run_name one"):format(rfile))
    assert.are.equal(0, rc1, out1)
    local cmd = ("OMP_NUM_THREADS=1 SLURM_CONF=%s/slurm.conf srun -n 2 --mpi=pmix --kill-on-bad-exit=1 %s/remax run %s "
      .. "--per_device_train_batch_size 4 --zero_stage 2 --run_name srun 2>&1; echo \"rc=$?\""):format(cluster, cli.build_dir(), rfile)
    local p = assert(io.popen(cmd))
    local out = p:read("*a")
    p:close()
    assert.are.equal(0, tonumber(out:match("rc=(%d+)%s*$")), out)
    assert.is_truthy(out:find("2 ranks (mpi", 1, true), out)
    same_rollouts(dir .. "/runs/one", dir .. "/runs/srun")
    for _, file in ipairs({ "model.safetensors", "trainer_state.safetensors" }) do
      local worst, bits = compare_weights(dir .. "/runs/one/checkpoints/step-3/" .. file, dir .. "/runs/srun/checkpoints/step-3/" .. file)
      assert.is_true(bits, ("%s differs: largest relative difference %g"):format(file, worst))
    end
  end)
end)
