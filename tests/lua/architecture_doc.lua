-- The file table of docs/architecture.md ("The Lua library"): every module under lua/remax/ with
-- its line count and what its first comment line says it owns, made from the files so the two
-- never drift far. tests/lua/architecture_doc_spec.lua checks the table; after moving, adding or
-- growing modules, run
--   luajit tests/lua/architecture_doc.lua docs/architecture.md      (rewrites the table in place)
local M = {}

M.BEGIN, M.END = "<!-- lua-files: tests/lua/architecture_doc.lua -->", "<!-- /lua-files -->"

-- lua/remax's modules in folder order, each {path, lines, owns}.
function M.files()
  local list = {}
  local p = io.popen("find lua/remax -name '*.lua' | sort")
  for path in p:lines() do
    local lines, first = 0, nil
    for line in io.lines(path) do
      lines = lines + 1
      if lines == 1 then first = line end
    end
    local owns = (first or ""):gsub("^%-%-%s*[%w%._]+:%s*", "")
    list[#list + 1] = { path = path, lines = lines, owns = owns }
  end
  p:close()
  return list
end

function M.markdown()
  local out = { M.BEGIN, "| folder | file | lines | owns (its first line) |", "|---|---|---|---|" }
  for _, f in ipairs(M.files()) do
    local folder, name = f.path:match("^lua/remax/(.-)/?([^/]+)$")
    out[#out + 1] = ("| %s | %s | %d | %s |"):format(folder == "" and "." or folder, name, f.lines, (f.owns:gsub("|", "\\|")))
  end
  out[#out + 1] = M.END
  return table.concat(out, "\n")
end

-- text with the table between the markers replaced by the current one.
function M.rewrite(text)
  local a = text:find(M.BEGIN, 1, true)
  local _, b = text:find(M.END, 1, true)
  if not a or not b then error("docs/architecture.md has no " .. M.BEGIN .. " ... " .. M.END .. " section", 0) end
  return text:sub(1, a - 1) .. M.markdown() .. text:sub(b + 1)
end

if arg and arg[0] and arg[0]:match("architecture_doc%.lua$") and arg[1] then
  local f = assert(io.open(arg[1], "rb"))
  local text = f:read("*a")
  f:close()
  f = assert(io.open(arg[1], "wb"))
  f:write(M.rewrite(text))
  f:close()
end

return M
