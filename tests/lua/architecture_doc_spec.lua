-- docs/architecture.md's table of Lua modules is true: every module is listed, nothing listed is
-- gone, and each stated line count is within 20% of the file's (the table is remade by
-- luajit tests/lua/architecture_doc.lua docs/architecture.md).
local doc = require("architecture_doc")

describe("docs/architecture.md", function()
  it("lists every Lua module with a line count that is still about right", function()
    local f = assert(io.open("docs/architecture.md", "rb"))
    local text = f:read("*a")
    f:close()
    local stated = {}
    for folder, name, lines in text:gmatch("\n| ([%w_%./]+) | ([%w_]+%.lua) | (%d+) |") do
      stated[(folder == "." and "" or folder .. "/") .. name] = tonumber(lines)
    end
    local problems = {}
    local seen = {}
    for _, m in ipairs(doc.files()) do
      local key = m.path:gsub("^lua/remax/", "")
      seen[key] = true
      local n = stated[key]
      if not n then problems[#problems + 1] = key .. " is not in the table"
      elseif math.abs(n - m.lines) > 0.2 * m.lines + 5 then
        problems[#problems + 1] = ("%s: the table says %d lines, the file has %d"):format(key, n, m.lines)
      end
    end
    for key in pairs(stated) do if not seen[key] then problems[#problems + 1] = key .. " is listed but not there" end end
    table.sort(problems)
    assert.are.same({}, problems, "run: luajit tests/lua/architecture_doc.lua docs/architecture.md")
  end)
end)
