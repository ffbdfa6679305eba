-- The "Every setting" tables of docs/trainer.md, made from the settings' records (remax.settings.records) so the
-- two never drift. tests/lua/settings_doc_spec.lua compares; after changing a setting, run
--   luajit tests/lua/settings_doc.lua docs/trainer.md      (rewrites the section in place)
local M = {}

local function cell(s) return (tostring(s):gsub("|", "\\|")) end

-- The markdown of every group: a heading, a note, a table.
function M.markdown()
  require("remax.step.algos").register()   -- algo's and loss_type's choices
  local config = require("remax.settings.config")
  local out = {}
  for _, group in ipairs(config.groups) do
    out[#out + 1] = "### " .. group.name
    out[#out + 1] = ""
    if group.doc then
      out[#out + 1] = group.doc
      out[#out + 1] = ""
    end
    out[#out + 1] = "| key | default | type | meaning |"
    out[#out + 1] = "|---|---|---|---|"
    for _, decl in ipairs(group.settings) do
      local default = decl.default == nil and "—" or config.show(decl.default)
      out[#out + 1] = ("| `%s` | `%s` | %s | %s%s |"):format(decl.name, default, cell(config.type_text(decl)),
        cell(config.help_of(decl)), decl.hot and " *(hot)*" or "")
    end
    out[#out + 1] = ""
  end
  return table.concat(out, "\n")
end

M.START = "\n### Model and data\n"

-- The document with its settings section (from "### Model and data" to the end) made anew.
function M.rewrite(text)
  local at = text:find(M.START, 1, true)
  if not at then error("docs/trainer.md: no '### Model and data' section", 0) end
  return text:sub(1, at) .. M.markdown()
end

if arg and arg[0] and arg[0]:match("settings_doc%.lua$") then
  package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
  local path = arg[1] or "docs/trainer.md"
  local f = assert(io.open(path, "rb"))
  local text = f:read("*a")
  f:close()
  f = assert(io.open(path, "wb"))
  f:write(M.rewrite(text))
  f:close()
end

return M
