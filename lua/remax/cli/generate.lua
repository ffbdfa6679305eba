-- remax.cli.generate: `remax generate`, completions of one prompt from a Hugging Face model
-- folder. With one row it streams the text as tokens come; with --n N it prints N completions.
--
--   remax generate --model DIR --prompt "Once upon a time" --max-new-tokens 64
--   remax generate --model DIR --prompt "What is 7*6?" --chat --n 4 --temperature 0.8 --top-p 0.95
--   remax generate --model DIR --prompt "Once" --min-p 0.05 --repetition-penalty 1.1
--   remax generate --model DIR --prompt-ids 9707,11,1879 --temperature 0
--   remax generate --model DIR --prompt "Hello" --device cuda --dtype bf16
local M = {}

M.usage = [[
usage: remax generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3) [options]

  --model DIR           Hugging Face folder: config.json, model.safetensors, tokenizer.json
  --prompt TEXT         the prompt, encoded with the folder's tokenizer
  --prompt-ids LIST     the prompt as comma-separated token ids (no tokenizer needed)
  --chat                wrap the prompt as a user message in the tokenizer's chat template
  --template NAME       with --chat: chatml, llama3 or plain instead of the tokenizer's own
  --no-thinking         with --chat: enable_thinking = false for the template (Qwen3)
  --n N                 completions of the prompt (default 1; one completion streams)
  --temperature T       0 = greedy (default 1)
  --top-p P             nucleus sampling: keep the smallest most likely set with mass >= P (default 1)
  --top-k K             keep the K most likely tokens; 0 = off (default 0)
  --min-p P             drop tokens less likely than P times the most likely one, after
                        top-k and top-p; 0 = off (default 0)
  --repetition-penalty R  CTRL's penalty on the prompt's and completion's tokens, before the
                        temperature: positive logits divided by R, negative ones multiplied
                        (greedy too); 1 = off (default 1)
  --max-new-tokens M    tokens per completion (default 128)
  --seed S              random seed (default 0): the same seed gives the same completions
  --dtype D             on the cpu, weight storage: auto (default: bf16 when the checkpoint
                        stores bf16, else f32), f32, or bf16 (half the memory, faster decoding;
                        compute is f32); on cuda, the compute dtype: auto or f32 (the CPU's
                        tokens), or bf16 (f32 master weights, bf16 compute and KV cache)
  --device D            cpu (default) or cuda: the weights, KV cache and sampler on the GPU
  --stop ID[,ID...]     extra stop token ids (the tokenizer's eos and generation_config.json's
                        eos_token_id always stop)
  --stop-string TEXT    also end a completion where TEXT appears in its text (vLLM's stop);
                        the completion keeps the token that completed it
]]

local flags = {   -- name -> kind
  model = "string", prompt = "string", template = "string", ["prompt-ids"] = "string", chat = "bool", n = "int",
  ["no-thinking"] = "bool",
  temperature = "number", ["top-p"] = "number", ["top-k"] = "int", ["max-new-tokens"] = "int",
  ["min-p"] = "number", ["repetition-penalty"] = "number",
  seed = "int", stop = "string", ["stop-string"] = "string", dtype = "string", device = "string", help = "bool",
}

M.MAX_N = 65536   -- completions of one prompt in one batch

local function fail(msg) error("generate: " .. msg .. "\n\n" .. M.usage, 0) end

function M.parse(argv)
  local o = { dtype = "auto", device = "cpu", n = 1, temperature = 1.0, ["top-p"] = 1.0, ["top-k"] = 0, ["max-new-tokens"] = 128,
    ["min-p"] = 0.0, ["repetition-penalty"] = 1.0, seed = 0, show = {} }
  local i = 1
  while i <= #argv do
    local name, inline = argv[i]:match("^%-%-([%w%-_]+)=(.*)$")
    name = name or argv[i]:match("^%-%-([%w%-_]+)$")
    if argv[i] == "-h" then name = "help" end
    name = name and name:gsub("_", "-")   -- --max_new_tokens is --max-new-tokens
    local kind = name and flags[name]
    if not kind then fail(("unknown argument '%s'"):format(argv[i])) end
    if kind == "bool" then
      -- a bare flag, or followed by true/false/1/0 (any case)
      local v = inline or argv[i + 1]
      local b = v and ({ ["true"] = true, ["1"] = true, yes = true, ["false"] = false, ["0"] = false, no = false })[v:lower()]
      if inline and b == nil then fail(("--%s=%s: expected true or false"):format(name, inline)) end
      if b == nil then
        o[name] = true
        i = i + 1
      else
        o[name] = b or nil
        i = i + (inline and 1 or 2)
      end
    else
      local v = inline or argv[i + 1]
      if v == nil then fail(("--%s needs a value"):format(name)) end
      if kind ~= "string" then
        local x = tonumber(v)
        if not x or (kind == "int" and x ~= math.floor(x)) then
          fail(("--%s %s: expected %s"):format(name, v, kind == "int" and "an integer" or "a number"))
        end
        o.show[name] = v   -- as typed, for messages
        v = x
      end
      o[name] = v
      i = i + (inline and 1 or 2)
    end
  end
  if o.help then return o end
  if not o.model then fail("missing --model DIR") end
  if (o.prompt == nil) == (o["prompt-ids"] == nil) then fail("give exactly one of --prompt TEXT and --prompt-ids LIST") end
  if not (o.n >= 1 and o.n <= M.MAX_N) then fail(("--n %s: expected a whole number in [1, %d]"):format(o.show.n, M.MAX_N)) end
  -- the model's max_position_embeddings bounds it too (checked once the model is loaded)
  if not (o["max-new-tokens"] >= 1 and o["max-new-tokens"] < 2 ^ 31) then
    fail(("--max-new-tokens %s: expected a whole number in [1, 2^31)"):format(o.show["max-new-tokens"]))
  end
  if not (o.temperature >= 0 and o.temperature < math.huge) then
    fail(("--temperature %s: expected a finite number >= 0 (0 = greedy)"):format(o.show.temperature))
  end
  -- a seed the sampler cannot take exactly would silently become another one (-1, 1e30 and
  -- 1e300 all gave the same completion)
  if not (o.seed >= 0 and o.seed < 2 ^ 53) then
    fail(("--seed %s: expected a whole number in [0, 2^53)"):format(o.show.seed))
  end
  if not (o["top-p"] > 0 and o["top-p"] <= 1) then fail(("--top-p %g: expected a number in (0, 1]"):format(o["top-p"])) end
  if not (o["min-p"] >= 0 and o["min-p"] <= 1) then fail(("--min-p %g: expected a number in [0, 1]"):format(o["min-p"])) end
  local rp = o["repetition-penalty"]
  if not (rp > 0 and rp < math.huge) then fail(("--repetition-penalty %g: expected a number > 0 (1 = off)"):format(rp)) end
  if o.template and not o.chat then fail("--template needs --chat") end
  if o["stop-string"] == "" then fail("--stop-string: expected a non-empty text") end
  if o.device ~= "cpu" and o.device ~= "cuda" then fail(("--device %s: expected cpu or cuda"):format(o.device)) end
  if o.dtype ~= "auto" and o.dtype ~= "f32" and o.dtype ~= "bf16" then
    if o.device == "cuda" then fail(("--dtype %s: on cuda the compute dtype is auto, f32 or bf16"):format(o.dtype)) end
    fail(("--dtype %s: the CPU keeps weights in auto, f32 or bf16 (compute is f32)"):format(o.dtype))
  end
  if o["top-k"] < 0 then fail(("--top-k %d: expected >= 0"):format(o["top-k"])) end
  return o
end

local function id_list(s, flag)
  local ids = {}
  for item in (s .. ","):gmatch("([^,]*),") do
    local x = tonumber(item)
    if not x or x ~= math.floor(x) or x < 0 then fail(("%s: '%s' is not a token id"):format(flag, item)) end
    ids[#ids + 1] = x
  end
  if #ids == 0 then fail(flag .. ": no token ids") end
  return ids
end

-- Prints tokens as they come: decodes everything generated so far and writes what is new,
-- holding back bytes that begin a UTF-8 character not yet complete.
local function streamer(tok, out)
  local tokenizer = require("remax.bind.tokenizer")
  local ids, written = {}, 0
  local s = {}
  function s.push(id)
    ids[#ids + 1] = id
    local text = tok:decode(ids, { skip_special_tokens = true })
    local upto = #text - tokenizer.incomplete_utf8_tail(text)
    if upto > written then
      out:write(text:sub(written + 1, upto))
      out:flush()
      written = upto
    end
  end
  function s.finish()
    local text = tok:decode(ids, { skip_special_tokens = true })
    if #text > written then out:write(text:sub(written + 1)) end
    out:write("\n")
    out:flush()
  end
  return s
end

-- Calls f(...), turning an error into a plain message (no Lua file:line: a user error; a fault
-- in remax stays an internal error, remax.cli.errors).
local function plain(f, ...)
  local ok, a, b = pcall(f, ...)
  if not ok then
    local msg = require("remax.cli.errors").message(a)
    if msg:match("^internal error: ") then error(msg, 0) end
    error(msg:match("^generate: ") and msg or "generate: " .. msg, 0)
  end
  return a, b
end

function M.main(...)
  local o = M.parse({ ... })
  if o.help then io.write(M.usage); return 0 end
  local remax = require("remax")
  local dir = require("remax.formats.hf_cache").model_dir(o.model, "generate: --model")   -- a folder or a cached name
  local tok
  local has_tokenizer = io.open(dir .. "/tokenizer.json", "rb")
  if has_tokenizer then has_tokenizer:close(); tok = plain(remax.tokenizer.load, dir)
  elseif o.prompt then error(("generate: %s has no tokenizer.json (give --prompt-ids instead)"):format(dir), 0) end

  local prompt
  if o["prompt-ids"] then
    prompt = id_list(o["prompt-ids"], "--prompt-ids")
    if o.chat then fail("--chat needs --prompt TEXT") end
  elseif o.chat then
    prompt = plain(remax.chat.encode, tok, o.prompt, { tokenizer = tok, template = o.template,
      enable_thinking = o["no-thinking"] and false or nil })
  else
    prompt = remax.chat.encode_text(tok, o.prompt, false)
  end
  if o["stop-string"] and not tok then
    error(("generate: --stop-string needs the folder's tokenizer.json to read the text (%s has none)"):format(dir), 0)
  end
  local load_opts = { weight_dtype = o.dtype }
  if o.device == "cuda" and not remax.tensor.has_cuda() then
    error("generate: --device cuda: no usable CUDA device (remax built without CUDA, or no GPU visible); "
      .. "`remax version` names the CUDA backend", 0)
  end
  if o.device == "cuda" then   -- f32 master weights; compute in f32 (auto) or bf16
    load_opts = { device = "cuda", dtype = o.dtype == "bf16" and "bf16" or "f32" }
  end
  local model = plain(remax.model.load, dir, load_opts)
  local positions = tonumber(model.config.max_position_embeddings)
  if positions and #prompt + o["max-new-tokens"] > positions then
    error(("generate: --max-new-tokens %s: the prompt's %d tokens and the completion must fit in the model's "
      .. "max_position_embeddings = %d (%s/config.json): at most %d new tokens"):format(o.show["max-new-tokens"] or
      o["max-new-tokens"], #prompt, positions, dir, math.max(positions - #prompt, 0)), 0)
  end
  local stop = remax.tokenizer.stop_ids(tok, dir, { ids = o.stop and id_list(o.stop, "--stop") or nil })

  local function per_row(v)   -- one entry per row: n rows of the one prompt
    local l = {}
    for i = 1, o.n do l[i] = v end
    return l
  end
  local opts = { temperature = per_row(o.temperature), top_p = o["top-p"], top_k = o["top-k"], min_p = o["min-p"],
    repetition_penalty = o["repetition-penalty"],
    stop_strings = o["stop-string"] and { o["stop-string"] } or nil,
    detokenize = tok and function(ids) return tok:decode(ids, { skip_special_tokens = true }) end,
    max_new_tokens = o["max-new-tokens"], seed = o.seed, stop = stop }
  local stream
  if o.n == 1 then
    stream = tok and streamer(tok, io.stdout) or
      { push = function(id) io.write(id, " "); io.flush() end, finish = function() io.write("\n") end }
    local shown = 0
    opts.on_token = function(_, tokens, lengths, cap)
      while shown < lengths[0] do
        stream.push(tokens[shown])
        shown = shown + 1
      end
    end
  end
  local out = plain(model.generate, model, { prompt }, opts)
  if stream then
    stream.finish()
  else
    for i, row in ipairs(out.rows) do
      io.write(("--- completion %d (%d tokens, %s)\n"):format(i, #row.tokens, row.finish))
      if tok then io.write(tok:decode(row.tokens, { skip_special_tokens = true }), "\n")
      else io.write(table.concat(row.tokens, " "), "\n") end
    end
  end
  io.stderr:write(("generate: %d prompt tokens, %d new tokens in %.2f s (%.1f tokens/s), KV cache %.1f MiB\n"):format(
    #prompt, out.tokens_generated, out.seconds, out.tokens_generated / math.max(out.seconds, 1e-9), out.cache_bytes / 2 ^ 20))
  return 0
end

return M
