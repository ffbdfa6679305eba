-- episodes_spec: multi-turn rollouts (remax.step.episodes, tools, tool_calls, environment) on a
-- tiny model: continued KV caches against full forwards, observation tokens against the chat
-- templates, every tool and environment failure, the greedy (ReMax baseline) episode against a
-- greedy policy run by hand, and the loss mask's zero gradient on observation tokens.
local remax = require("remax")
local support = require("support")
local chat = require("remax.text.chat")
local episodes = require("remax.step.episodes")
local tools = require("remax.step.tools")
local tool_calls = require("remax.step.tool_calls")
local algos = require("remax.step.algos")
local tensor = require("remax.bind.tensor")
local rollout = require("remax.step.rollout")

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local function tiny(vocab, seed)
  return remax.model.new(support.tiny_model({ vocab_size = vocab, hidden_size = 16, intermediate_size = 24,
    max_position_embeddings = 256, tie_word_embeddings = false }), { seed = seed or 1, init_std = 0.3 })
end

local function concat(...)
  local out = {}
  for i = 1, select("#", ...) do for _, x in ipairs(select(i, ...)) do out[#out + 1] = x end end
  return out
end

describe("model:generate with on_turn_end", function()
  it("continues rows from their KV cache: every model token's logprob is the full forward's over the episode", function()
    local m = tiny(40, 3)
    local prompts = { { 1, 5, 9, 13, 2 }, { 7, 3 } }
    local appended, made = {}, {}   -- row -> turn -> the observation appended; row -> model tokens so far
    local out = m:generate(prompts, { temperature = { 1, 0 }, max_new_tokens = 12, seed = 5, stop = { 4, 11, 17, 23, 30 },
      on_turn_end = function(events)
        local add = {}
        for _, e in ipairs(events) do
          local r = e.row
          appended[r] = appended[r] or {}
          made[r] = (made[r] or 0) + #e.tokens
          local turn = #appended[r] + 1
          if turn <= 3 and made[r] < 12 then
            local ids = {}
            for i = 1, (r + turn) % 4 + 1 do ids[i] = (3 * r + 7 * turn + i) % 40 end
            appended[r][turn], add[r] = ids, ids
          end
        end
        return add
      end })
    local continued = 0
    for r, row in ipairs(out.rows) do
      local seq, model_at = { unpack(prompts[row.prompt]) }, {}
      local at = 0
      for turn, stop in ipairs(row.turn_ends) do
        for t = at + 1, stop do seq[#seq + 1] = row.tokens[t]; model_at[#seq] = t end
        at = stop
        for _, id in ipairs((appended[r] or {})[turn] or {}) do seq[#seq + 1] = id end
        if (appended[r] or {})[turn] then continued = continued + 1 end
      end
      for t = at + 1, #row.tokens do seq[#seq + 1] = row.tokens[t]; model_at[#seq] = t end
      local lp = m:logprobs({ seq }):totable()[1]
      local n = 0
      for pos, t in pairs(model_at) do
        n = n + 1
        assert.is_true(math.abs(lp[pos] - row.logprobs[t]) < 1e-4,
          ("row %d token %d: continued %g, full forward %g"):format(r, t, row.logprobs[t], lp[pos]))
      end
      assert.are.equal(#row.tokens, n)
    end
    assert.is_true(continued >= 3, "episodes continued " .. continued .. " times")
  end)

  it("refuses a bad observation, naming the row", function()
    local m = tiny(40)
    local every = {}
    for i = 0, 39 do every[#every + 1] = i end   -- the first token ends the turn
    assert.has_error(function()
      m:generate({ { 1, 2 } }, { max_new_tokens = 6, stop = every, temperature = 0,
        on_turn_end = function(events) return { [events[1].row] = { 99 } } end })
    end, "generate: on_turn_end: row 1, token 1: 99 is not a token id in [0, 40)")
  end)
end)

describe("observation tokens", function()
  local tok_stub = {
    eos_token = "<|im_end|>", bos_token = "<|begin_of_text|>",
    encode = function(_, text) return { string.byte(text, 1, -1) } end,
  }
  local templates = { ["qwen2.5"] = "<|im_end|>", qwen3 = "<|im_end|>", smollm2 = "<|im_end|>",
    ["llama3.1"] = "<|eot_id|>", ["llama3.2"] = "<|eot_id|>" }
  for name, model_end in pairs(templates) do
    it("are the suffix the " .. name .. " template adds for the new messages", function()
      local t = { chat_template = read("tests/fixtures/chat_templates/" .. name .. ".jinja"), bos_token = "<|begin_of_text|>",
        eos_token = model_end }
      local tool_list = tools.schemas(tools.check({ calc = { description = "arithmetic", parameters = { type = "object",
        properties = { e = { type = "string" } } }, fn = function() end } }))
      local opts = function(gen) return { tokenizer = t, add_generation_prompt = gen, template_args = { tools = tool_list },
        template_args_date = nil } end
      local render = function(msgs, gen) return chat.render(msgs, opts(gen)) end
      local conv = { { role = "system", content = "Use tools." }, { role = "user", content = "What is 6*7?" } }
      local text = render(conv, true)
      for turn = 1, 3 do
        local reply = turn == 1 and '<tool_call>{"name": "calc", "arguments": {"e": "6*7"}}</tool_call>' or ("answer " .. turn)
        local assistant = { role = "assistant", content = reply }
        local new = turn == 1 and { { role = "tool", content = "42" } } or { { role = "user", content = "and again? " .. turn } }
        local obs = episodes.observation_text(render, conv, assistant, new, model_end)
        text = text .. reply .. model_end .. obs   -- what the model wrote (its stop token too), then the observation
        conv = concat(conv, { assistant }, new)
        local whole = render(conv, true)
        if name == "qwen3" then   -- it drops earlier turns' empty <think> blocks: the tail after the last turn agrees
          assert.are.equal(whole:sub(-#obs), obs)
          assert.are.equal(reply .. model_end, whole:sub(-#obs - #reply - #model_end, -#obs - 1))
        else
          assert.are.equal(whole, text)
        end
      end
    end)
  end
end)

describe("tool calls", function()
  local t = tools.check({
    calc = { description = "d", parameters = { type = "object", properties = { x = { type = "number" } }, required = { "x" } },
      fn = function(a) return a.x * 2 end },
    hang = { fn = function() local i = 0 while true do i = i + 1 end end },
    boom = { fn = function() error("kaput", 0) end },
  })
  local function results(text, format)
    local out = {}
    for _, c in ipairs(tool_calls.parse(text, format)) do
      local r, ok, _, kind = tools.call(t, c, 0.2)
      out[#out + 1] = { r, ok, kind }
    end
    return out
  end
  it("reads Qwen calls and gives every failure its error as the result", function()
    local r = results('a <tool_call>{"name":"calc","arguments":{"x":3}}</tool_call><tool_call>{"name":"calc","arguments":{"y":1}}</tool_call>' ..
      '<tool_call>{oops</tool_call><tool_call>{"name":"nope"}</tool_call><tool_call>{"name":"hang"}</tool_call>' ..
      '<tool_call>{"name":"boom"}</tool_call><tool_call>{"name":"calc","arguments":{"x":"3"}}</tool_call><tool_call>{"name"')
    local want = {
      { "6", true, "ok" },
      { "Error: bad arguments for 'calc': missing required argument 'x'", false, "bad_args" },
      { "Error: malformed tool call: not a JSON object", false, "malformed" },
      { "Error: unknown tool 'nope' (available: boom, calc, hang)", false, "unknown" },
      { "Error: tool 'hang' timed out after 0.2 s", false, "timeout" },
      { "Error: tool 'boom' failed: kaput", false, "error" },
      { "Error: bad arguments for 'calc': argument 'x' must be of type number, got string", false, "bad_args" },
      { "Error: malformed tool call: <tool_call> without </tool_call>", false, "malformed" },
    }
    assert.are.same(want, r)
  end)
  it("reads Llama 3.1 JSON calls, python_tag built-in calls and code, and a recipe's parser", function()
    assert.are.same({ { "8", true, "ok" } }, results('{"name": "calc", "parameters": {"x": 4}}', "llama3"))
    local c = tool_calls.parse('<|python_tag|>brave_search.call(query="x y", n=3)<|eom_id|>', "llama3")
    assert.are.same({ { name = "brave_search", arguments = { query = "x y", n = 3 } } }, c)
    assert.are.same({ { name = "code_interpreter", arguments = { code = "print(1)" } } }, tool_calls.parse("<|python_tag|>print(1)", "llama3"))
    assert.are.same({}, tool_calls.parse("The answer is 4.", "llama3"))
    local mine = function(text) local x = text:match("CALC%((%d+)%)") return x and { { name = "calc", arguments = { x = tonumber(x) } } } or {} end
    assert.are.same({ { "10", true, "ok" } }, results("CALC(5)", mine))
    assert.are.same("Error: the tool call parser failed: bad", tools.call(t, tool_calls.parse("x", function() error("bad", 0) end)[1]))
  end)
  it("writes a tool without parameters as properties {} in the template's JSON, as transformers does", function()
    local t = { chat_template = read("tests/fixtures/chat_templates/qwen2.5.jinja"), eos_token = "<|im_end|>" }
    local list = tools.schemas(tools.check({ now = { description = "the time", fn = function() return "noon" end } }))
    local text = chat.render({ { role = "user", content = "time?" } },
      { tokenizer = t, add_generation_prompt = true, template_args = { tools = list } })
    assert.matches('"properties": {}', text, 1, true)
    assert.is_nil(text:find('"properties": []', 1, true), text)
  end)
  it("refuses bad tool tables naming the tool and key", function()
    assert.has_error(function() tools.check({ calc = { description = "d" } }) end, "tools.calc.fn must be a function(args) -> result, got nil")
    assert.has_error(function() tools.check({ calc = { fn = print, parameters = { type = "array" } } }) end,
      'tools.calc.parameters must be a JSON schema with type = "object"')
    assert.has_error(function() tools.check({ calc = { fn = print, parameters = { type = "object", required = { "q" } } } }) end,
      "tools.calc.parameters.required[1] = 'q' is not one of its properties")
  end)
end)

---------------------------------------------------------------------------- episodes through a Step

local tokenizer = require("remax.bind.tokenizer")

-- A guessing game: the secret is 7; each reply that holds a digit is a guess; feedback each turn,
-- done on a right guess (reward 1) or after three turns; every turn that guesses earns 0.1.
local game = {
  reset = function(sample, state) state.turn = 0 return { { role = "user", content = sample.prompt } } end,
  step = function(state, text)
    state.turn = state.turn + 1
    local d = tonumber(text:match("%d"))
    if d == 7 then return "right", true, 1 end
    return d and (d < 7 and "higher" or "lower") or ("say a digit (" .. state.turn .. ")"), false, d and 0.1 or 0
  end,
}

local STOP = { 258 }
for id = 100, 129 do STOP[#STOP + 1] = id end   -- turns end within a few tokens on a random model

local function fake_step(m, tok, cfg_extra)
  local cfg = { max_completion_length = 20, max_prompt_length = 64, max_turns = 3, max_episode_length = 400,
    tool_timeout = 1, sampling = rollout.plan(2, true, 1.0), environment = game }
  for k, v in pairs(cfg_extra or {}) do cfg[k] = v end
  return { cfg = cfg, model = m, tok = tok, stop = STOP, template = { template = "chatml" }, template_name = "chatml",
    seed_for = function(_, s) return 1000 + s end, progress = function() end }
end

describe("episodes.rollout", function()
  local tok = tokenizer.load("tests/fixtures/byte_tokenizer")
  local m = tiny(260, 11)
  local prompts = { { prompt = "guess my digit" }, { prompt = "a digit, please" } }
  local step = fake_step(m, tok)
  local ro = episodes.rollout(step, prompts, { step = 1 })

  it("gives one sequence per episode with the model's tokens in its loss mask", function()
    assert.are.equal(6, #ro.rows)
    local multi = 0
    for _, r in ipairs(ro.rows) do
      local model = 0
      for _, x in ipairs(r.loss_mask) do model = model + x end
      assert.are.equal(#r.model_ids, model)
      assert.are.equal(#r.tokens, #r.loss_mask)
      assert.are.equal(r.episode.model_tokens, model)
      assert.are.equal(r.episode.obs_tokens, #r.tokens - model)
      assert.is_true(r.episode.turns >= 1 and r.episode.turns <= 3)
      assert.is_true(#r.model_ids <= 20)
      if r.episode.turns > 1 then multi = multi + 1 end
      -- the messages alternate the model's turns and the game's replies
      for i, msg in ipairs(r.completion_messages) do assert.are.equal(i % 2 == 1 and "assistant" or "user", msg.role) end
    end
    assert.is_true(multi >= 3, multi .. " episodes had more than one turn")
    local mt = episodes.metrics(ro)
    assert.is_true(mt["episodes/observation_tokens"] > 0 and mt.num_turns_mean > 1)
  end)

  it("makes the greedy row the episode a greedy policy plays against the same game (the ReMax baseline)", function()
    local stop = {}
    for _, id in ipairs(STOP) do stop[id] = true end
    for i, p in ipairs(prompts) do
      local row = ro.rows[ro:index(i, ro.slots)]
      assert.is_true(row.greedy)
      local state, msgs = {}, nil
      msgs = game.reset(p, state)
      local seq = chat.encode(tok, msgs, { template = "chatml" })
      local n0, want, made, reward = #seq, {}, 0, 0
      for turn = 1, 3 do
        local ids = {}
        repeat   -- greedy: the argmax of a full forward, every token
          local logits = m:next_logits({ seq }):totable()[1]
          local best = 1
          for v = 2, #logits do if logits[v] > logits[best] then best = v end end
          ids[#ids + 1] = best - 1
          seq[#seq + 1] = best - 1
          made = made + 1
        until stop[best - 1] or made == 20
        local text = tok:decode(ids, { skip_special_tokens = true })
        local obs, done, r = game.step(state, text)
        reward = reward + (r or 0)
        local before = msgs
        msgs = concat(msgs, { { role = "assistant", content = text } })
        if done or turn == 3 or made == 20 then break end
        local new = { { role = "user", content = obs } }
        local render = function(ms, gen) return chat.render(ms, { template = "chatml", add_generation_prompt = gen }) end
        local otext = episodes.observation_text(render, before, { role = "assistant", content = text }, new,
          tok:decode({ ids[#ids] }, { skip_special_tokens = false }))
        for _, id in ipairs(tok:encode(otext, { add_special_tokens = false })) do seq[#seq + 1] = id end
        msgs = concat(msgs, new)
      end
      for t = n0 + 1, #seq do want[#want + 1] = seq[t] end
      assert.are.same(want, row.tokens)
      assert.is_true(math.abs(reward - (row.episode.env_reward or 0)) < 1e-12)
    end
  end)

  it("sums the game's per-turn rewards into the reward 'environment'", function()
    local total = { 0 / 0, 0 / 0, 0 / 0, 0 / 0, 0 / 0, 0 / 0 }
    local none = { true, true, true, true, true, true }
    local per, tot, unscored = episodes.add_environment_reward(ro, {}, total, 6, none)
    for k, r in ipairs(ro.rows) do
      local s = 0
      for _, v in ipairs(r.episode.turn_rewards) do s = s + v end
      assert.are.equal(s, per.environment[k])
      assert.are.equal(s, tot[k])
    end
    assert.are.equal(0, unscored)
  end)

  it("trains only the model's tokens: observation tokens get exactly zero gradient (finite differences)", function()
    local fm = remax.model.new(support.tiny_model({ vocab_size = 260, hidden_size = 16, intermediate_size = 24,
      tie_word_embeddings = false }), { seed = 11, init_std = 0.3, dtype = "f64" })
    local r = ro.rows[1]
    local seq = concat(ro.prompt_ids[1], r.tokens)
    local start = #ro.prompt_ids[1]
    local function completion_lp(train)
      local lp = fm:logprobs({ seq }, nil, { train = train }):totable()[1]
      local v = {}
      for t = 1, #r.tokens do v[t] = lp[start + t] end
      return v
    end
    local lp = completion_lp(true)
    local w = algos.token_weights({ { adv = 0.7, logp = episodes.model_only(lp, r.loss_mask) } }, { beta = 0 })
    local full = episodes.spread(w[1], r.loss_mask)
    local obs = 0
    for t, mk in ipairs(r.loss_mask) do if mk == 0 then obs = obs + 1; assert.are.equal(0, full[t]) end end
    assert.is_true(obs > 0)
    fm:zero_grad()
    fm:backward(tensor.from_row_spans({ full }, { start }, 1, #seq, "f64"))
    -- the loss the weights are the gradient of: the model tokens' weighted logprobs alone
    local function loss()
      local v, s = completion_lp(false), 0
      for t, mk in ipairs(r.loss_mask) do if mk == 1 then s = s + full[t] * v[t] end end
      return s
    end
    local name = "model.layers.0.self_attn.q_proj.weight"
    local p, g = fm:param(name), fm:grad(name)
    local h = 1e-6
    for _, i in ipairs({ 0, 17, 101 }) do
      local x = p:get(math.floor(i / 16) + 1, i % 16 + 1)
      p:set(math.floor(i / 16) + 1, i % 16 + 1, x + h)
      local up = loss()
      p:set(math.floor(i / 16) + 1, i % 16 + 1, x - h)
      local down = loss()
      p:set(math.floor(i / 16) + 1, i % 16 + 1, x)
      local fd, an = (up - down) / (2 * h), g:get(math.floor(i / 16) + 1, i % 16 + 1)
      assert.is_true(math.abs(fd - an) <= 1e-6 * math.max(1, math.abs(fd)), ("%s[%d]: backward %g, finite differences %g"):format(name, i, an, fd))
    end
  end)

  it("ends an episode on an environment that fails, counting it", function()
    local bad = fake_step(m, tok, { environment = { step = function() error("the game broke", 0) end } })
    local r2 = episodes.rollout(bad, { { prompt = "x" } }, { step = 2 })
    for _, r in ipairs(r2.rows) do
      assert.are.equal(1, r.episode.turns)
      assert.are.equal(1, r.episode.env_errors)
      assert.are.equal("environment step failed: the game broke", r.episode.env_error)
    end
  end)
end)
