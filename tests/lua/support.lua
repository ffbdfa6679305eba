-- Fixtures the Lua specs share: temporary folders and files (removed when the spec file ends),
-- reading and writing whole files, errors and the remax program, a small training run's folder
-- and settings, the tiny model config, and the LOWER reward.
local M = {}

-- The settings' algorithms and loss types, as the program's start registers them (cli/main.lua):
-- a spec that resolves settings needs them.
require("remax.step.algos").register()

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
M.try_read = require("remax.bind.fs").read_text

---------------------------------------------------------------------------- errors and tools

-- s quoted for the shell.
M.shell_quote = shell_quote

-- The remax program: the one beside the library in use when REMAX_LIB names one (the CUDA
-- emulator's build runs the specs named cuda), else the build's; an absolute path, so that a
-- spec may run it from another folder.
function M.remax_binary()
  local dir = (os.getenv("REMAX_LIB") or ""):match("^(.*)/[^/]*$")
  local f = dir and io.open(dir .. "/remax")
  if f then
    f:close()
    return dir .. "/remax"
  end
  local b = require("remax.cli.main").build_dir() .. "/remax"
  return b:sub(1, 1) == "/" and b or (os.getenv("PWD") .. "/" .. b)
end

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

---------------------------------------------------------------------------- the references

-- The tests' references are the ecosystem's own code (Hugging Face tokenizers and transformers,
-- PEFT, TensorBoard, gguf-py, llama.cpp through llama-cpp-python, torch), installed by
-- tests/references.sh into .cache/venv from tests/requirements.txt.
M.REFERENCE_HOME = (os.getenv("PWD") or ".") .. "/.cache"
M.REFERENCE_PYTHON = M.REFERENCE_HOME .. "/venv/bin/python"
M.REFERENCE_INSTALL = "tests/references.sh (pip install -r tests/requirements.txt into .cache/venv)"

-- Ends the running test as pending (busted reports it, with why, as skipped). Busted gives a
-- running test its own `pending`, which throws, in the test function's environment (env: the
-- caller's, getfenv); the one this file sees is describe's, which would only add another block.
local function skip(why, env)
  local p = env and env.pending
  if type(p) == "function" then p(why) end
end

local importable = {}
-- The reference Python when it imports every module named (reference("transformers", "torch")),
-- else nil and why. Specs call it inside `it` and skip themselves with that reason:
--   local py = support.reference("tokenizers"); if not py then return end
-- A missing reference is never a pass: the test is reported pending ("skipped: ..."), naming
-- the install line, and with REMAX_REFERENCES_REQUIRED=1 (CI) it fails instead.
function M.reference(...)
  local modules = table.concat({ ... }, ", ")
  if importable[modules] == nil then
    -- LuaJIT's popen:close() says nothing of the exit status: the command prints it last
    local p = io.popen(("%s -c %s 2>&1; echo \"rc=$?\""):format(shell_quote(M.REFERENCE_PYTHON),
      shell_quote("import " .. modules)))
    local out = p:read("*a")
    p:close()
    local rc = tonumber(out:match("rc=(%d+)%s*$"))
    importable[modules] = rc == 0 and true or (out:match("[^\n]*Error[^\n]*") or out:sub(1, 200))
  end
  if importable[modules] == true then return M.REFERENCE_PYTHON end
  local why = ("skipped: the reference %s cannot be imported from %s (%s); install it with %s"):format(
    modules, M.REFERENCE_PYTHON, tostring(importable[modules]), M.REFERENCE_INSTALL)
  if os.getenv("REMAX_REFERENCES_REQUIRED") == "1" then error(why:gsub("^skipped", "missing"), 2) end
  skip(why, getfenv(2))
  return nil, why
end

-- A file of the llama.cpp source that llama-cpp-python's sdist carries (.cache/llama.cpp/...:
-- models/ggml-vocab-*.gguf with .inp/.out, models/templates/*.jinja), or nil after skipping as
-- reference() does.
function M.llama_cpp_file(rel)
  local path = M.REFERENCE_HOME .. "/llama.cpp/" .. rel
  local f = io.open(path, "rb")
  if f then f:close() return path end
  local why = ("skipped: %s is missing (llama.cpp's source from llama-cpp-python's sdist); install it with %s"):format(
    path, M.REFERENCE_INSTALL)
  if os.getenv("REMAX_REFERENCES_REQUIRED") == "1" then error(why:gsub("^skipped", "missing"), 2) end
  skip(why, getfenv(2))
  return nil, why
end

-- Runs the reference Python on a script file with arguments; returns its stdout, and stops the
-- test with its output when it fails.
function M.run_reference(script, ...)
  local args = {}
  for i, a in ipairs({ ... }) do args[i] = shell_quote(a) end
  local err = M.tmpfile()
  local status = M.tmpfile()
  local p = io.popen(("%s %s %s 2>%s; echo $? >%s"):format(shell_quote(M.REFERENCE_PYTHON), shell_quote(script),
    table.concat(args, " "), shell_quote(err), shell_quote(status)))
  local out = p:read("*a")
  p:close()
  if tonumber(M.read(status)) ~= 0 then
    error(("reference %s failed: %s\n%s"):format(script, M.read(err):sub(-3000), out:sub(1, 1000)), 2)
  end
  return out
end

---------------------------------------------------------------------------- training fixtures

-- A JSON-lines prompt file of n rows at path: row i is `format` with i for each %d in it, by
-- default {"prompt": "say something i", "answer": "xi"}.
function M.prompts(path, n, format)
  format = format or '{"prompt": "say something %d", "answer": "x%d"}'
  local lines = {}
  for i = 1, n do lines[i] = format:format(i, i) end
  M.write(path, table.concat(lines, "\n") .. "\n")
  return path
end

-- A fresh folder for a training run: a reward file (opts.reward_file, default "lower.lua",
-- holding opts.reward, default M.LOWER) and p.jsonl of n prompts (M.prompts with
-- opts.prompt_format).
function M.train_dir(n, opts)
  opts = opts or {}
  local dir = M.tmpdir()
  M.write(dir .. "/" .. (opts.reward_file or "lower.lua"), opts.reward or M.LOWER)
  M.prompts(dir .. "/p.jsonl", n, opts.prompt_format)
  return dir
end

-- The settings of a small quiet run in a train_dir folder: its prompts and reward, the plain
-- chat template, no evaluation, checkpoints or logged completions, runs under dir/runs; then
-- the spec's own `fields` and the test's `extra` over them.
function M.run_settings(dir, fields, extra)
  local s = { data = dir .. "/p.jsonl", rewards = { dir .. "/lower.lua" }, chat_template = "plain", eval_size = 0,
    output_dir = dir .. "/runs", save_steps = 0, log_completions = 0 }
  for k, v in pairs(fields or {}) do s[k] = v end
  for k, v in pairs(extra or {}) do s[k] = v end
  return s
end

-- A reward of 0 for every completion that raises SIGINT (as Ctrl-C does) on its third call:
-- during step 2 of a run, the first call being the trainer's probe of the data.
function M.interrupting_reward()
  local ffi = require("ffi")
  pcall(ffi.cdef, "int raise(int sig);")
  local calls = 0
  return { name = "interrupting", fn = function(c)
    calls = calls + 1
    if calls == 3 then ffi.C.raise(2) end
    local r = {}
    for i = 1, #c do r[i] = 0 end
    return r
  end }
end

-- A gradient for log-probabilities lp (a [B, T] tensor): sin(7b + 3t) where lp is not 0 (a real
-- target), 0 on padding; its backward moves every weight of a model (sum(d * logp) as the loss).
function M.wavy_dlogp(lp)
  local d = {}
  for b, row in ipairs(lp:totable()) do
    d[b] = {}
    for t, v in ipairs(row) do d[b][t] = v ~= 0 and math.sin(b * 7 + t * 3) or 0 end
  end
  return d
end

-- A tiny Qwen2 model config (a few thousand parameters: a training step in milliseconds), with
-- the fields of each table of changes, in order, replacing its own. vocab_size is left out: the
-- trainer takes the byte-level tokenizer's.
function M.tiny_model(...)
  local c = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 32, intermediate_size = 64,
    num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 256,
    rope_theta = 10000, rms_norm_eps = 1e-6, tie_word_embeddings = true }
  for i = 1, select("#", ...) do
    for k, v in pairs(select(i, ...) or {}) do c[k] = v end
  end
  return c
end

-- A chat template function for episode specs with tools: chatml, after a system message naming
-- the tools it is given (the built-in chatml shows no tools, and is refused with them).
function M.chatml_tools(messages, opts)
  local jinja = require("remax.text.jinja")
  local text = require("remax.text.chat").render(messages, { template = "chatml", add_generation_prompt = opts.add_generation_prompt })
  local tools = opts.template_args and opts.template_args.tools
  if not tools or #tools == 0 then return text end
  local names = {}
  for i, t in ipairs(tools) do names[i] = jinja.to_lua(t)["function"].name end
  return "<|im_start|>system\nTools: " .. table.concat(names, ", ") .. "<|im_end|>\n" .. text
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


---------------------------------------------------------------------------- several processes

-- Why the mpirun specs cannot run here (nil: they can).
function M.mpi_missing()
  if os.execute("command -v mpirun >/dev/null 2>&1") ~= 0 then return "mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)" end
  if not M.try_read(require("remax.cli.main").build_dir() .. "/libremax_mpi.so") then
    return "remax was built without MPI (no libremax_mpi.so: CMake did not find libopenmpi-dev)"
  end
  return nil
end

-- Runs the built remax with args, under `mpirun -np ranks` when ranks > 1, one thread per rank;
-- env: "NAME=value ..." set for it, pass: the variables mpirun hands on ({ "FAIL_RANK", ... }).
-- Returns its output (stderr too) and exit code.
function M.run_remax(ranks, args, env, pass)
  local build = require("remax.cli.main").build_dir()
  local prefix = "OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none " .. (env or "") .. " "
  local cmd
  if ranks > 1 then
    local x = { "-x OMP_NUM_THREADS" }
    for _, name in ipairs(pass or {}) do x[#x + 1] = "-x " .. name end
    cmd = ("%smpirun --allow-run-as-root --oversubscribe -np %d %s %s/remax %s"):format(prefix, ranks, table.concat(x, " "),
      build, args)
  else
    cmd = ("%s%s/remax %s"):format(prefix, build, args)
  end
  local p = assert(io.popen(cmd .. " 2>&1; echo \"rc=$?\""))
  local out = p:read("*a")
  p:close()
  return out, tonumber(out:match("rc=(%d+)%s*$"))
end

-- The records of a JSON-lines file ({} when it is missing).
function M.jsonl(path)
  local cjson = require("cjson")
  local out = {}
  for line in (M.try_read(path) or ""):gmatch("[^\n]+") do out[#out + 1] = cjson.decode(line) end
  return out
end

-- Two checkpoints' weights: the largest |a - b| / max(|a|, |b|, 1e-3), whether every bit agrees,
-- and the L2 norm of the difference over the L2 norm of the first.
function M.compare_weights(dir_a, dir_b)
  local ffi = require("ffi")
  local st = require("remax.bind.safetensors")
  local a, b = st.open(dir_a), st.open(dir_b)
  local worst, same, num, den = 0, true, 0, 0
  for _, name in ipairs(a:names()) do
    local ta, tb = a:read(name, "f64"), b:read(name, "f64")
    local pa, pb = ffi.cast("double*", ta.data), ffi.cast("double*", tb.data)
    for i = 0, tonumber(ta.numel) - 1 do
      local x, y = pa[i], pb[i]
      num, den = num + (x - y) ^ 2, den + x ^ 2
      if x ~= y then
        same = false
        worst = math.max(worst, math.abs(x - y) / math.max(math.abs(x), math.abs(y), 1e-3))
      end
    end
  end
  a:close()
  b:close()
  return worst, same, math.sqrt(num / den)
end

return M
