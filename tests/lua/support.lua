-- Fixtures the Lua specs share: temporary folders and files (removed when the spec file ends),
-- reading and writing whole files, the tiny model config, and the LOWER reward.
local M = {}

---------------------------------------------------------------------------- temporary files

-- Everything made here is removed when busted finishes the spec file that made it (its
-- "file end" event), so one `./remax test` leaves no lua_* folders in the temp directory.
local made = {}

local function shell_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

function M.cleanup()
  for i = #made, 1, -1 do
    os.execute("rm -rf " .. shell_quote(made[i]))
    made[i] = nil
  end
end

local ok, busted = pcall(require, "busted")
if ok and type(busted) == "table" and busted.subscribe then
  busted.subscribe({ "file", "end" }, function()
    M.cleanup()
    return nil, true   -- let the other subscribers run too
  end)
end

-- A fresh empty folder.
function M.tmpdir()
  local d = os.tmpname()
  os.remove(d)
  os.execute("mkdir -p " .. shell_quote(d))
  made[#made + 1] = d
  return d
end

-- A fresh file name (the file exists, empty, as os.tmpname leaves it).
function M.tmpfile()
  local p = os.tmpname()
  made[#made + 1] = p
  return p
end

---------------------------------------------------------------------------- whole files

function M.write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

-- The file's bytes; stops the test when it cannot be read.
function M.read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- The file's bytes, or nil when it does not exist.
function M.try_read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

---------------------------------------------------------------------------- errors and tools

-- The error message f(...) raises, as a string; the test fails when f does not raise.
function M.error_of(f, ...)
  local ok, err = pcall(f, ...)
  assert(not ok, "expected an error")
  return tostring(err)
end

-- Whether python3 runs here (specs that read results back with Python's standard library).
function M.has_python()
  local p = io.popen("python3 -c 'print(1)' 2>/dev/null")
  local out = p:read("*a")
  p:close()
  return out:match("1") ~= nil
end

---------------------------------------------------------------------------- training fixtures

-- A JSON-lines prompt file of n rows {"prompt": "say something i", "answer": "xi"} at path.
function M.prompts(path, n)
  local lines = {}
  for i = 1, n do lines[i] = ('{"prompt": "say something %d", "answer": "x%d"}'):format(i, i) end
  M.write(path, table.concat(lines, "\n") .. "\n")
  return path
end

-- A tiny Qwen2 model config (a few thousand parameters: a training step in milliseconds), with
-- fields of `changes` replacing its own. vocab_size is left out: the trainer takes the byte-level
-- tokenizer's.
function M.tiny_model(changes)
  local c = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 32, intermediate_size = 64,
    num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 256,
    rope_theta = 10000, rms_norm_eps = 1e-6, tie_word_embeddings = true }
  for k, v in pairs(changes or {}) do c[k] = v end
  return c
end

-- A reward file's text: the share of lower-case ASCII letters (byte-level ids 97..122) among a
-- completion's tokens, 0 for an empty completion. A tiny model learns it within a few steps.
M.LOWER = [[
return { name = "lower", fn = function(completions, batch)
  local s = {}
  for i in ipairs(completions) do
    local ids, n = batch.completion_ids[i], 0
    for _, id in ipairs(ids) do if id >= 97 and id <= 122 then n = n + 1 end end
    s[i] = #ids > 0 and n / #ids or 0
  end
  return s
end }
]]

return M
