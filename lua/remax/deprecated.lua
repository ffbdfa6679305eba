-- remax.deprecated: old module names that keep working for a while after a module moves. The
-- first require of an old name says once, on stderr, where the module lives now; set
-- REMAX_QUIET_DEPRECATED=1 to silence it.
local M = {}
local said = {}

-- The module `new`, required under its old name `old`.
function M.moved(old, new)
  if not said[old] and os.getenv("REMAX_QUIET_DEPRECATED") ~= "1" then
    said[old] = true
    io.stderr:write(("remax: require(%q) is deprecated: the module is now %q (use require(\"remax\") where you can)\n")
      :format(old, new))
  end
  return require(new)
end

return M
