-- bench/trl_prompts.lua: a recipe's prompts as JSONL, for the TRL peer (bench/trl_peer.py): the
-- training prompts in the order a run of the recipe draws them (its data function's train split,
-- train_size rows, shuffled by the run's sampler with the recipe's seed), and its held-out split.
-- Each line: {"prompt": the text the model sees (the recipe's template applied), "prompt_ids":
-- remax's token ids of it, "answer", "final_answer", and "messages" where the prompt is a
-- conversation (after the recipe's map_row, as a run applies it)}.
--
--   ./remax run bench/trl_prompts.lua [--recipe recipes/gsm8k.lua] [--out runs/trl_peer] [--train 4096]
--
-- Writes OUT/train.jsonl (the first --train prompts a run draws) and OUT/test.jsonl (eval_size).
local cjson = require("cjson")
local config = require("remax.settings.config")
local setup = require("remax.run.setup")
local tokenizer = require("remax.bind.tokenizer")
local chat = require("remax.text.chat")
local common = dofile(arg[0]:match("^(.-)[^/]*$") .. "common.lua")

local opts = common.options({ recipe = "recipes/gsm8k.lua", out = "runs/trl_peer", train = 4096 }, arg)
local cfg = config.resolve(dofile(opts.recipe), {}, { where = opts.recipe })
if type(cfg.data) ~= "function" then error(opts.recipe .. ": data is not a function(split, n, cfg); export a file's rows directly", 0) end
local tok = tokenizer.load(cfg.model or setup.DEFAULT_MODEL)
local template = setup.template(cfg, tok)

local function dataset(split, n)
  local ds = cfg.data(split, n, cfg)
  ds = ds.rows and ds or require("remax.formats.data").from_rows(ds, { name = split })
  if cfg.map_row then for i, row in ipairs(ds.rows) do ds.rows[i] = cfg.map_row(row) end end
  return ds
end

local function write(path, rows)
  local f = assert(io.open(path, "w"))
  for _, row in ipairs(rows) do
    local ids, text = chat.encode(tok, row.prompt, template)
    if #ids > cfg.max_prompt_length then error(("a prompt of %d tokens is longer than max_prompt_length"):format(#ids), 0) end
    f:write(cjson.encode({ prompt = text, prompt_ids = ids, answer = row.answer, final_answer = row.final_answer,
      messages = type(row.prompt) == "table" and row.prompt or nil }), "\n")
  end
  f:close()
  print(("%s: %d prompts"):format(path, #rows))
end

os.execute("mkdir -p '" .. opts.out .. "'")
-- the run's sampler over all train_size rows: the same permutation a run draws from
local train = dataset("train", cfg.train_size)
local sampler = train:sampler({ seed = cfg.seed, shuffle = true, batch_size = 1 })
local drawn = {}
for i = 1, math.min(opts.train, cfg.train_size) do drawn[i] = sampler:next_batch()[1] end
write(opts.out .. "/train.jsonl", drawn)
write(opts.out .. "/test.jsonl", dataset("test", cfg.eval_size).rows)
