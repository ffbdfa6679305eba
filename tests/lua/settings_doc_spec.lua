-- docs/trainer.md lists every setting with the default, type and meaning config.lua declares.
local settings_doc = require("settings_doc")

describe("docs/trainer.md", function()
  it("has a row for every setting, as config.lua declares it", function()
    local f = assert(io.open("docs/trainer.md", "rb"))
    local text = f:read("*a")
    f:close()
    local config = require("remax.settings.config")
    for _, k in ipairs(config.order) do
      assert.is_truthy(text:find("| `" .. k .. "` |", 1, true), k .. " has no row in docs/trainer.md")
    end
    assert.are.equal(settings_doc.rewrite(text), text,
      "docs/trainer.md's settings differ from config.lua: run luajit tests/lua/settings_doc.lua docs/trainer.md")
  end)
end)
