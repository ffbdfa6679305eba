-- remax.cli.main: the `remax` command line. The host program runs this file with the arguments.
local M = {}

local usage = [[
usage: remax <command> [arguments]

commands:
  run FILE.lua [args...]   run a Lua file with the engine loaded; a file that returns a recipe
                           table trains it: remax run RECIPE.lua [--key value ...] [--help]
                           (--resume runs/<name> continues a run from its last checkpoint;
                           --device cuda trains and generates on an NVIDIA GPU, f32 or
                           --dtype bf16)
  eval RECIPE.lua --model DIR [--samples K] [--key value ...]
                           held-out greedy accuracy and reward of a model, no training; with
                           --samples K also sampled accuracy, pass@1..K and the headroom
  render RECIPE.lua [--row N] [--key value ...]
                           print the run's first prompt exactly as the model sees it: chat
                           template, tools and an environment's first messages included
  generate --model DIR --prompt TEXT [options]
                           sample completions of a prompt (remax generate --help)
  export --model DIR --gguf OUT.gguf [--type f32|bf16|f16|q8_0]
                           write a model as GGUF for llama.cpp and Ollama (remax export --help)
  test                     run every test: C unit tests (ctest) and Lua specs (busted)
  version                  print the version
  help                     this text
]]

local function home() return os.getenv("REMAX_HOME") or "." end

-- The build folder (libremax, the remax program, the C tests): $REMAX_BUILD_DIR, libremax's folder,
-- or build/ under the home.
local function build_dir()
  local lib = os.getenv("REMAX_LIB")
  return os.getenv("REMAX_BUILD_DIR") or (lib and lib:match("^(.*)/[^/]+$")) or (home() .. "/build")
end

M.build_dir = build_dir

local function shell_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- A recipe table + command-line arguments -> resolved config (or nil after printing --help).
local function recipe_config(file, recipe, argv)
  local config = require("remax.settings.config")
  local overrides, help = config.parse_args(argv)
  local cfg
  if overrides.resume or recipe.resume then   -- the run's own config.json, changed only by the command line
    local resume = require("remax.run.resume")
    local changes
    cfg, changes = resume.resolve(recipe, overrides, { where = file })
    if not help then for _, line in ipairs(resume.describe(cfg.resume, changes)) do print(line) end end
  else
    cfg = config.resolve(recipe, overrides, { where = file })
  end
  if help then
    print(config.help(cfg, ("remax run %s: settings (recipe values, then --key value overrides):"):format(file)))
    return nil
  end
  return cfg, overrides
end

-- Train a recipe: the file returned a table of settings (and functions).
function M.train_recipe(file, recipe, argv)
  local cfg, overrides = recipe_config(file, recipe, argv)
  if not cfg then return 0 end
  local trainer = require("remax.run.run")
  local t = trainer.new(cfg, { recipe_path = file, overrides = overrides })
  local out = t:train(cfg.loop)
  return out.interrupted and 130 or 0
end

-- `remax run --help` / `remax eval --help` without a recipe: the usage and every setting with its default.
local function command_help(usage_line)
  local config = require("remax.settings.config")
  print(usage_line)
  print(config.help(config.resolve({}, {}), "settings (defaults; a recipe sets its own, --key value overrides):"))
  return 0
end

local function is_help(a) return a == "--help" or a == "-h" or a == "help" end

function M.run(file, ...)
  if is_help(file) then
    return command_help("usage: remax run FILE.lua [--key value ...]\n  runs a Lua file; a file that returns a recipe table trains it"
      .. " (--resume runs/<name> continues a run with its own settings)\n")
  end
  if not file then error("remax run: missing FILE.lua (usage: remax run FILE.lua [args...])", 0) end
  local chunk, err = loadfile(file)
  if not chunk then
    if not io.open(file, "rb") then error(("cannot open %s"):format(file), 0) end
    error(err, 0)
  end
  _G.arg = { [0] = file, ... }
  local errors = require("remax.cli.errors")
  local results = { xpcall(chunk, function(e) return e end, ...) }
  if not results[1] then
    local e = results[2]
    -- the file itself ended the program: a script may choose its exit status
    if errors.is_exit(e) then return tonumber(e.code) or (e.code == false and 1 or 0) end
    -- a message that starts with the script's own position is the script's error: say whose
    if type(e) == "string" and not errors.split_position(e) then error(("%s failed: %s"):format(file, e), 0) end
    error(e, 0)
  end
  local r = results[2]
  if type(r) == "table" then return M.train_recipe(file, r, { ... }) end
  if r == nil then return 0 end
  if type(r) == "number" and r == math.floor(r) and r >= 0 and r <= 255 then
    if r ~= 0 then
      io.stderr:write(("remax: %s returned %d, not a recipe table: exit status %d (a recipe returns a table of settings)\n")
        :format(file, r, r))
    end
    return r
  end
  error(("%s returned a %s (%s); a recipe returns a table of settings, a script nothing or an exit status 0..255")
    :format(file, type(r), tostring(r)), 0)
end

-- "--samples K" taken out of an eval command line: K (0 when absent) and the other arguments.
local function take_samples(argv)
  local rest, K = {}, 0
  local i = 1
  while i <= #argv do
    local a = argv[i]
    local v = a:match("^%-%-samples=(.*)$")
    if a == "--samples" then v = argv[i + 1]; i = i + 1 end
    if v then
      K = tonumber(v)
      if not K or K < 1 or K ~= math.floor(K) or K > 1024 then
        error(("remax eval: --samples %s: need an integer from 1 to 1024"):format(tostring(v)), 0)
      end
    else
      rest[#rest + 1] = a
    end
    i = i + 1
  end
  return K, rest
end

-- The report of an evaluation, as lines.
function M.eval_report(e, source, accuracy_name)
  local lines = { ("%s: greedy %s %.1f%% (%d prompts), mean reward %.4f, greedy completion %.1f tokens"):format(
    source or "model", accuracy_name or "accuracy", 100 * e.accuracy, e.n, e.reward, e.greedy_length_mean or 0) }
  if e.samples then
    local se = math.sqrt(e.accuracy * (1 - e.accuracy) / e.n)
    lines[1] = lines[1] .. (" (one standard error %.1f points)"):format(100 * se)
    lines[#lines + 1] = ("sampled accuracy %.1f%% (%d samples per prompt)"):format(100 * e.sampled_accuracy, e.samples)
    local pk = {}
    for _, p in ipairs(e.pass_at) do pk[#pk + 1] = ("pass@%d %.1f%%"):format(p.k, 100 * p.value) end
    lines[#lines + 1] = table.concat(pk, ", ")
    lines[#lines + 1] = ("greedy wrong on %.1f%% of prompts; greedy wrong but a sample right on %.1f%% (headroom)")
      :format(100 * e.greedy_wrong, 100 * e.headroom)
  end
  return lines
end

-- Held-out greedy accuracy and mean reward of a model under a recipe's settings; with
-- --samples K also sampled accuracy, pass@k and the headroom.
function M.eval(file, ...)
  if is_help(file) then
    return command_help("usage: remax eval RECIPE.lua --model DIR [--samples K] [--key value ...]\n  held-out greedy accuracy "
      .. "and reward of a model, no training; --samples K adds sampled accuracy, pass@1..K and the headroom\n")
  end
  if not file then error("remax eval: missing RECIPE.lua (usage: remax eval RECIPE.lua --model DIR [--samples K])", 0) end
  local K, argv = take_samples({ ... })
  local recipe = require("remax.settings.recipe").load(file, unpack(argv))
  local cfg = recipe_config(file, recipe, argv)
  if not cfg then return 0 end
  local t = require("remax.run.run").new(cfg, { recipe_path = file, eval_only = true })
  local e = t:evaluate({ samples = K })
  if not e.n then error("remax eval: no eval set (give --eval_data FILE, or use the synthetic data)", 0) end
  if t.dist.is_root then
    for _, line in ipairs(M.eval_report(e, t.model_source, t.accuracy_name)) do print(line) end
  end
  return 0
end

-- Runs a command, echoing its output, and returns the output and whether it exited 0.
local function run_and_echo(cmd)
  local pipe = assert(io.popen(cmd .. " 2>&1"))
  local out = {}
  for line in pipe:lines() do
    io.write(line, "\n")
    io.flush()
    out[#out + 1] = line
  end
  local ok = pipe:close()
  return table.concat(out, "\n"), ok == true or ok == 0
end

-- Runs ctest in a build folder (only the tests labelled `label` when given); returns passed,
-- failed and the names of the skipped tests.
local function run_ctest(bdir, filter, label)
  local ctest = ("ctest --test-dir %s --output-on-failure %s %s"):format(shell_quote(bdir),
    filter and ("-R " .. shell_quote(filter)) or "", label and ("-L " .. label) or "")
  local out = run_and_echo(ctest)
  local _, nfail, total = out:match("(%d+)%% tests passed, (%d+) tests? failed out of (%d+)")
  local skipped = {}
  for name in out:gmatch("%d+ %- ([%w_]+) %(Skipped%)") do skipped[#skipped + 1] = name end
  if total then return tonumber(total) - tonumber(nfail) - #skipped, tonumber(nfail), skipped end
  if out:match("No tests were found") then return 0, 0, skipped end
  return 0, 1, skipped   -- ctest itself failed to run
end

function M.test(...)
  local passed, failed = 0, 0
  local filter = select(1, ...)
  local bdir = build_dir()

  print("== C unit tests (ctest)")
  local p, f, skipped = run_ctest(bdir, filter)
  passed, failed = passed + p, failed + f

  if #skipped > 0 then
    print(("GPU tests skipped (no CUDA device here, or remax built without CUDA): %s"):format(table.concat(skipped, ", ")))
  end

  -- The CUDA emulator's build (cmake -S . -B build-emu -DRX_CUDA=emulate), when there is one: the
  -- GPU tests again, with device "cuda" executed on the CPU (docs/gpu.md, "Emulation").
  local emu = os.getenv("REMAX_EMU_BUILD_DIR") or (home() .. "/build-emu")
  local cache = io.open(emu .. "/CMakeCache.txt")
  if cache then
    cache:close()
    print(("\n== GPU tests on the CUDA emulator (%s)"):format(emu))
    local _, built = run_and_echo(("cmake --build %s --target gpu_tests remax remax_host -j 2 >%s 2>&1"):format(shell_quote(emu),
      shell_quote(emu .. "/build.log")))
    if built then
      p, f = run_ctest(emu, filter, "gpu")
      passed, failed = passed + p, failed + f
      -- the Lua specs named "cuda" (the trainer on the device) against the emulator's library
      if not filter or filter:find("cuda", 1, true) then
        print(("\n== Lua specs on the CUDA emulator (busted --filter=cuda, %s/libremax.so)"):format(emu))
        local out = run_and_echo(("cd %s && REMAX_LIB=%s busted --lua=luajit --filter=%s tests/lua"):format(
          shell_quote(home()), shell_quote(emu .. "/libremax.so"), shell_quote(filter or "cuda")))
        local s, fl, e = out:match("(%d+) successe?s? / (%d+) failures? / (%d+) errors?")
        if s then passed, failed = passed + tonumber(s), failed + tonumber(fl) + tonumber(e)
        else failed = failed + 1 end
      end
    else
      print(("the emulator build failed (log: %s/build.log)"):format(emu))
      failed = failed + 1
    end
  end

  -- The references (tests/references.sh: the ecosystem's own tokenizers, transformers, PEFT,
  -- TensorBoard, gguf-py and llama.cpp in .cache/venv), made once and kept; a spec whose reference
  -- is missing reports itself as skipped with the install line.
  print("\n== the tests' Python references (tests/references.sh, .cache/venv)")
  local _, refs_ok = run_and_echo(("cd %s && sh tests/references.sh 2>&1"):format(shell_quote(home())))
  if not refs_ok then print("some references could not be installed: the specs that need them are skipped") end

  print("\n== Lua specs (busted)")
  local busted = ("cd %s && busted --lua=luajit %s tests/lua"):format(shell_quote(home()),
    filter and ("--filter=" .. shell_quote(filter)) or "")
  local out = run_and_echo(busted)
  local s, f, e = out:match("(%d+) successe?s? / (%d+) failures? / (%d+) errors?")
  local pend = tonumber(out:match("(%d+) pending") or 0)
  if s then
    passed = passed + tonumber(s)
    failed = failed + tonumber(f) + tonumber(e)
  else
    failed = failed + 1   -- busted could not run the specs at all
  end

  print(("\n%d passed, %d failed%s"):format(passed, failed,
    pend > 0 and (", %d skipped (busted lists them above with the reason)"):format(pend) or ""))
  return failed == 0 and 0 or 1
end

function M.main(cmd, ...)
  if cmd == nil or cmd == "help" or cmd == "--help" or cmd == "-h" then
    io.write(usage)
    return 0
  elseif cmd == "run" then
    return M.run(...)
  elseif cmd == "eval" then
    return M.eval(...)
  elseif cmd == "render" then
    return require("remax.cli.render").main(...)
  elseif cmd == "generate" then
    return require("remax.cli.generate").main(...)
  elseif cmd == "export" then
    return require("remax.formats.gguf").main(...)
  elseif cmd == "test" then
    return M.test(...)
  elseif cmd == "version" or cmd == "--version" then
    local remax = require("remax")
    print(("remax %s (OpenBLAS kernels: %s; CUDA: %s; bf16 kernels: %s; bf16 training: %s, dtype auto = %s)"):format(
      remax.version(), remax.blas_core(), remax.cuda_backend(), remax.bf16_kernels(), remax.bf16_train_kernels(),
      remax.bf16_train_pays() and "bf16" or "f32"))
    local compute = require("remax.run.compute")
    print(("GEMMs: f32 training: %s; bf16 training: %s"):format(compute.gemms("f32"), remax.bf16_train_kernels()))
    print(("threads: %d OpenMP thread(s), %s%s"):format(compute.threads(), compute.adapt_note(),
      os.getenv("REMAX_THREADS_NOTE") and ("; " .. os.getenv("REMAX_THREADS_NOTE")) or ""))
    local overrides = require("remax.bind.options").overrides()
    if overrides then print("engine options set by the environment (developer overrides): " .. overrides) end
    return 0
  end
  io.stderr:write(("remax: unknown command '%s'\n\n"):format(cmd), usage)
  return 2
end

-- Run as the host's entry script (with arguments), or required as a module. The program's Lua
-- starts here: recipes and scripts it runs may still require old module names (remax.deprecated),
-- and the settings learn the algorithms and loss types (remax.step.algos) before any is resolved.
if ... ~= "remax.cli.main" then
  require("remax.deprecated").register()
  require("remax.step.algos").register()
  return require("remax.cli.errors").run(M.main, ...)
end
return M
