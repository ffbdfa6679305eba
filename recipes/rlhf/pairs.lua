-- recipes/rlhf/pairs.lua: stage (a) of the RLHF chain (recipes/rlhf/README.md): preference pairs
-- with a hidden true preference, written to data/rlhf/pairs_{train,test}.jsonl.
--
--   ./remax run recipes/rlhf/pairs.lua [OUT_DIR] [PROBLEMS]      # default data/rlhf, 320 problems
--
-- The built-in model (models/tiny-gsm8k) samples 4 completions of each synthetic GSM8K-style
-- problem (remax.tasks.gsm8k_synth, the split the ReMax stage trains on for train pairs, the
-- held-out split for test pairs). The hidden truth is rewards/gsm8k.lua's: a completion with the
-- right final answer is preferred to one with a wrong answer. A problem whose samples are all
-- right (or all wrong) gives a pair of its reference solution (right) over the same solution with
-- the final number changed (wrong) instead. The reward model never sees the truth, only which
-- side was preferred; stage (c) reports the truth beside the reward model's score.
local remax = require("remax")
local synth = require("remax.tasks.gsm8k_synth")
local chat = require("remax.text.chat")
local rewards = require("remax.step.rewards")
local data = remax.data
local cjson = require("cjson")
local fs = require("remax.bind.fs")

local out_dir = arg and arg[1] or "data/rlhf"
local problems = tonumber(arg and arg[2]) or 320
local MODEL = (os.getenv("REMAX_HOME") and os.getenv("REMAX_HOME") .. "/" or "") .. "models/tiny-gsm8k"
local SAMPLES, SEED = 4, 21

local model = remax.model.load(MODEL, { dtype = "f32" })
local tok = remax.tokenizer.load(MODEL)
local stop = remax.tokenizer.stop_ids(tok, MODEL, { chat_ends = true })
local truth = rewards.load_all({ "gsm8k" }, { base = "." })

-- the same final number, changed: a wrong answer in the reference's own words
local function corrupt(answer, i)
  local n = tonumber(data.final_answer(answer)) or 0
  local wrong = n + 1 + (i % 3)
  return (answer:gsub("####%s*[%-%d%.,]+%s*$", "#### " .. wrong))
end

local function pairs_of(split, n, seed)
  local rows = synth.generate(n, { seed = seed, steps = { 1, 2 }, max_number = 12, split = split })
  local ids = {}
  for i, r in ipairs(rows) do ids[i] = chat.encode(tok, r.question, { template = "qa" }) end
  local temps = {}
  for s = 1, SAMPLES do temps[s] = 1.0 end
  local out, on_policy = {}, 0
  local chunk = 32
  for first = 1, #rows, chunk do
    local p, b = {}, {}
    for i = first, math.min(#rows, first + chunk - 1) do p[#p + 1], b[#b + 1] = ids[i], rows[i] end
    local gen = model:generate(p, { max_new_tokens = 320, temperature = temps, stop = stop, seed = seed * 7919 + first })
    local completions, batch = {}, { final_answer = {}, answer = {}, prompt = {} }
    for k, row in ipairs(gen.rows) do
      completions[k] = tok:decode(row.tokens, { skip_special_tokens = true })
      local src = b[row.prompt]
      batch.final_answer[k], batch.answer[k], batch.prompt[k] = data.final_answer(src.answer), src.answer, src.question
    end
    local per = rewards.score(truth, nil, completions, batch, {})
    local right = per[truth[1].name]
    for j, src in ipairs(b) do
      local good, bad
      for k, row in ipairs(gen.rows) do
        if row.prompt == j then
          if right[k] == 1 and not good then good = completions[k] end
          if right[k] ~= 1 and not bad and completions[k]:find("%S") then bad = completions[k] end
        end
      end
      local i = first + j - 1
      if good and bad and good ~= bad then
        out[#out + 1] = { prompt = src.question, chosen = good, rejected = bad, source = "samples" }
        on_policy = on_policy + 1
      else
        out[#out + 1] = { prompt = src.question, chosen = src.answer, rejected = corrupt(src.answer, i), source = "reference" }
      end
    end
  end
  return out, on_policy
end

fs.mkdir_p(out_dir)
for _, split in ipairs({ { "train", problems, SEED }, { "test", math.max(64, math.floor(problems / 4)), SEED + 1 } }) do
  local list, on_policy = pairs_of(split[1], split[2], split[3])
  local lines = {}
  for i, r in ipairs(list) do lines[i] = cjson.encode(r) end
  local path = ("%s/pairs_%s.jsonl"):format(out_dir, split[1])
  fs.write_atomic(path, table.concat(lines, "\n") .. "\n")
  print(("%s: %d pairs (%d from the model's own samples, right over wrong; %d reference over corrupted)"):format(path,
    #list, on_policy, #list - on_policy))
end
