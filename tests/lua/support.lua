-- Helpers the Lua specs share: a fresh temporary folder and writing a whole file.
local M = {}

function M.tmpdir()
  local d = os.tmpname()
  os.remove(d)
  os.execute("mkdir -p " .. d)
  return d
end

function M.write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

return M
