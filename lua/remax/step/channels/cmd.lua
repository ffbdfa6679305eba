-- remax.step.channels.cmd: "cmd:PROGRAM ARGS...", any program (run by /bin/sh) that speaks the
-- wire format itself on its stdin and stdout: one JSON request per line in, one answer line
-- out per request, echoing its "id", in any order. One worker per command and registry.
local worker = require("remax.step.channels.worker")

local M = {}

local function command_of(spec)
  local command = spec:sub(5):match("^%s*(.-)%s*$")
  if command == "" then error("expected cmd:PROGRAM [ARGS...]", 0) end
  return command
end

function M.key(spec)
  command_of(spec)
  return spec
end

-- o: max_line, restarts.
function M.open(spec, o)
  return worker.new({ spec = spec, label = "the worker " .. spec, max_line = o.max_line, restarts = o.restarts,
    argv = { "/bin/sh", "-c", command_of(spec) } })
end

local function basename(p) return (p:match("([^/]+)$") or p) end

-- Interpreters whose first file argument names a command ("python3 score.py" is "score").
local INTERPRETERS = { sh = true, bash = true, dash = true, zsh = true, ksh = true, env = true, exec = true,
  python = true, python2 = true, python3 = true, pypy = true, pypy3 = true, node = true, deno = true, bun = true,
  ruby = true, perl = true, php = true, lua = true, luajit = true, Rscript = true, julia = true, java = true,
  nice = true, nohup = true, uv = true, run = true }

-- The name of a command: its program's file name without the extension (the script's, when the
-- program is an interpreter), never an argument after it.
function M.program_name(command)
  local words = {}
  for w in command:gmatch("%S+") do words[#words + 1] = (w:gsub("^[\"']", ""):gsub("[\"']$", "")) end
  local i = 1
  while words[i] and words[i]:match("^[%a_][%w_]*=") do i = i + 1 end   -- VAR=value before the program
  local program = words[i]
  if not program then return "cmd" end
  local function stem(w) return (basename(w):gsub("%.[%w]+$", "")) end
  local b = basename(program)
  if INTERPRETERS[b] or b:match("^python%d[%.%d]*$") then
    local j = i + 1
    while words[j] do
      local w = words[j]
      if w == "-m" and words[j + 1] then return (words[j + 1]:gsub("^.*%.", "")) end
      if w == "-c" or w == "-e" then return stem(program) end   -- inline code: the interpreter
      if not w:match("^%-") and not w:match("^[%a_][%w_]*=") and not INTERPRETERS[basename(w)] then return stem(w) end
      j = j + 1
    end
  end
  local n = stem(program)
  return n ~= "" and n or "cmd"
end

return M
