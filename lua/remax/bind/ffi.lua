-- remax.bind.ffi: loads engine/include/remax.h into LuaJIT's FFI and finds libremax.
-- There is one copy of the declarations: the header itself, read at run time.
local ffi = require("ffi")

local M = {}

local function script_home()
  -- this file is <home>/lua/remax/bind/ffi.lua
  local src = debug.getinfo(1, "S").source:gsub("^@", "")
  return (src:match("^(.*)/lua/remax/bind/ffi%.lua$")) or "."
end

M.home = os.getenv("REMAX_HOME") or script_home()

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

local function find_header()
  for _, rel in ipairs({ "/engine/include/remax.h", "/include/remax.h" }) do
    local text = read_file(M.home .. rel)
    if text then return text, M.home .. rel end
  end
  error("remax: cannot find remax.h under " .. M.home .. " (set REMAX_HOME)")
end

-- The header minus preprocessor lines is plain C declarations that ffi.cdef accepts.
function M.declarations(text)
  local out = {}
  for line in (text .. "\n"):gmatch("(.-)\n") do
    if not line:match("^%s*#") then out[#out + 1] = line end
  end
  return table.concat(out, "\n")
end

local header, header_path = find_header()
M.header_path = header_path
ffi.cdef(M.declarations(header))

local function load_library()
  -- Inside the remax host the library is already linked into the process.
  if pcall(function() return ffi.C.rx_version end) then return ffi.C end
  local candidates = { os.getenv("REMAX_LIB"), M.home .. "/build/libremax.so", "remax" }
  local errors = {}
  for i = 1, 3 do   -- not ipairs: an unset REMAX_LIB leaves a hole at 1
    local path = candidates[i]
    if path and path ~= "" then
      local ok, lib = pcall(ffi.load, path)
      if ok then return lib end
      errors[#errors + 1] = tostring(lib)
    end
  end
  error("remax: cannot load libremax (build it with ./remax, or set REMAX_LIB):\n  " .. table.concat(errors, "\n  "))
end

M.C = load_library()
local C = M.C

-- Raise a Lua error carrying the engine's message when a call returns a non-zero status.
function M.check(rc, level)
  if rc ~= 0 then error(ffi.string(C.rx_last_error()), (level or 1) + 1) end
end

function M.last_error() return ffi.string(C.rx_last_error()) end

return M
