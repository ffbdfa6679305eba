-- bench/reward_check.lua: rewards/gsm8k.lua on cases from a JSONL file, for bench/trl_peer.py's
-- check of its Python port and of math-verify: each input line {"completion": ..., "final_answer":
-- ...} gives one output line {"score": 0 or 1, "extracted": the answer found or null, "form": where}.
--   ./remax run bench/reward_check.lua CASES.jsonl > SCORES.jsonl
local cjson = require("cjson")
local reward = dofile("rewards/gsm8k.lua")
local path = assert(arg[1], "usage: remax run bench/reward_check.lua CASES.jsonl")
local completions, refs = {}, {}
for line in io.lines(path) do
  local case = cjson.decode(line)
  completions[#completions + 1] = case.completion
  refs[#refs + 1] = case.final_answer
end
local scores = reward.fn(completions, { final_answer = refs })
for i, text in ipairs(completions) do
  local got, form = reward.extract_answer(text)
  print(cjson.encode({ score = scores[i], extracted = got or cjson.null, form = form or cjson.null }))
end
