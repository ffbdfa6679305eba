-- rollout_spec.lua: remax.step.rollout, the one owner of a step's row layout (prompt-major,
-- sampled slots then the greedy slot), its groups, training rows, and packing and merging across
-- ranks.
local rollout = require("remax.step.rollout")
local dist = require("remax.bind.dist")

-- A rollout of prompts {"a", "b", ...} with G samples (+ greedy) each, rows as model:generate
-- returns them (prompt-major), rewards reward0 + row index.
local function make(prompts, G, greedy, reward0)
  local plan = rollout.plan(G, greedy, 0.7)
  local rows, ids = {}, {}
  for i, p in ipairs(prompts) do
    ids[i] = { 10 + i, 20 + i }
    for s = 1, plan.slots do
      rows[#rows + 1] = { prompt = i, slot = s, text = p .. s, tokens = { s, 2 * s }, finish = s == 1 and "length" or "stop" }
    end
  end
  local dataset_rows = {}
  for i, p in ipairs(prompts) do dataset_rows[i] = { prompt = p } end
  local ro = rollout.new(plan, { prompts = dataset_rows, prompt_ids = ids, rows = rows, tokens_generated = 3 * #prompts,
    time_generate = reward0, time_score = 0, unscored = 0, step = 1 })
  ro.total, ro.per = {}, { r = {} }
  for k = 1, #rows do ro.total[k], ro.per.r[k] = reward0 + k, reward0 + k end
  return ro
end

describe("rollout", function()
  it("plans G sampled slots at the temperature and a greedy slot at 0", function()
    assert.are.same({ num_generations = 3, greedy = true, slots = 4, temperatures = { 0.7, 0.7, 0.7, 0 } },
      rollout.plan(3, true, 0.7))
    assert.are.same({ 1, 1 }, rollout.plan(2, false, 1).temperatures)
    assert.are.same({ 0 }, rollout.plan(0, true, 1).temperatures)   -- evaluation: greedy rows only
  end)

  it("marks the last slot greedy and groups values per prompt", function()
    local ro = make({ "a", "b" }, 2, true, 0)
    local greedy = {}
    for k, r in ipairs(ro.rows) do greedy[k] = r.greedy end
    assert.are.same({ false, false, true, false, false, true }, greedy)
    assert.are.same({ { samples = { 1, 2 }, greedy = 3 }, { samples = { 4, 5 }, greedy = 6 } }, ro:grouped(ro.total))
    local t = ro:sample_table({ 1, nil, 3, 4, 5, 6 })
    assert.are.equal(1, t[1][1])
    assert.is_true(t[1][2] ~= t[1][2])   -- a missing value is NaN
    assert.are.same({ 4, 5 }, t[2])
    assert.are.equal(ro:index(2, 3), 6)
  end)

  it("has no greedy rows without a greedy slot", function()
    local ro = make({ "a" }, 2, false, 0)
    for _, r in ipairs(ro.rows) do assert.is_false(r.greedy) end
    assert.are.same({ { samples = { 1, 2 } } }, ro:grouped(ro.total))
  end)

  it("trains the sampled rows with their advantages and masks truncated ones on request", function()
    local ro = make({ "a", "b" }, 2, true, 0)
    assert.is_nil(ro:advantage(1))   -- no advantages yet
    ro.adv = { { 0.5, -0.5 }, { 1, 0 } }
    local rows = ro:training_rows(true)
    assert.are.equal(4, #rows)
    assert.are.same({ 0.5, -0.5, 1, 0 }, { rows[1].adv, rows[2].adv, rows[3].adv, rows[4].adv })
    assert.are.same({ 1, 2, 4, 5 }, { rows[1].key, rows[2].key, rows[3].key, rows[4].key })
    assert.is_true(rows[1].masked)   -- slot 1 hit the length limit
    assert.is_nil(rows[2].masked)
    assert.is_nil(ro:training_rows(false)[1].masked)
    assert.are.same({ 12, 22 }, rows[3].prompt_ids)
    assert.are.equal(-0.5, ro:advantage(2))
    assert.is_nil(ro:advantage(3))   -- the greedy row
    local seqs, lens, starts = ro:sequences({ 5 })
    assert.are.same({ { 12, 22, 2, 4 } }, seqs)
    assert.are.same({ 2 }, lens)
    assert.are.same({ 2 }, starts)
  end)

  it("lines the reward inputs up with the rows", function()
    local ro = make({ "a", "b" }, 1, true, 0)
    local collate = require("remax.formats.data").collate
    local completions, batch = ro:reward_inputs(collate)
    assert.are.same({ "a1", "a2", "b1", "b2" }, completions)
    assert.are.same({ "a", "a", "b", "b" }, batch.prompt)
    assert.are.same({ false, true, false, true }, batch.greedy)
    assert.are.same({ 11, 21 }, batch.prompt_ids[2])
    assert.are.same({ "length", "stop", "length", "stop" }, batch.finish)
  end)

  it("merges the ranks' rollouts in global prompt order", function()
    local function part(prompts, reward0)
      local ro = make(prompts, 1, true, reward0)
      ro.adv = {}
      for i = 1, #prompts do ro.adv[i] = { reward0 + i } end
      ro.groups = ro:grouped(ro.total)
      ro.none = { [2] = true }   -- the first prompt's greedy row: no reward scored it
      return dist.decode(dist.encode(ro:pack()))   -- as another rank sends it
    end
    local whole = rollout.merge({ part({ "a", "b" }, 10), part({ "c" }, 20) })
    assert.are.same({ "a", "b", "c" }, { whole.prompts[1].prompt, whole.prompts[2].prompt, whole.prompts[3].prompt })
    assert.are.equal(6, #whole.rows)
    assert.are.equal(3, whole.rows[5].prompt)
    assert.are.equal("c1", whole.rows[5].text)
    assert.are.same({ 11, 12, 13, 14, 21, 22 }, whole.total)
    assert.are.same(whole.total, whole.per.r)
    assert.are.same({ { 11 }, { 12 }, { 21 } }, whole.adv)
    assert.are.equal(9, whole.tokens_generated)
    assert.are.equal(20, whole.time_generate)   -- the slowest rank's
    assert.are.equal(21, whole:advantage(5))   -- still a rollout
    -- what the step's metrics read: rewards by prompt, and the rows no reward scored
    assert.are.same({ { samples = { 11 }, greedy = 12 }, { samples = { 13 }, greedy = 14 }, { samples = { 21 }, greedy = 22 } },
      whole.groups)
    assert.are.same({ [2] = true, [6] = true }, whole.none)
  end)
end)
