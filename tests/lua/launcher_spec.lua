-- The ./remax launcher installs oneDNN (libdnnl-dev, the bf16 training GEMMs) where it installs
-- the required packages, as .ci/run does: as root with apt-get; otherwise it says how (issue
-- 36, item 4). apt-get and id are stand-ins on PATH that record their calls; the build is the
-- worktree's own (already built), so nothing is installed or rebuilt.
local support = require("support")
local q = support.shell_quote

local function launch(uid, extra_env)
  local bin = support.tmpdir()
  local log = bin .. "/apt.log"
  support.write(bin .. "/id", ("#!/bin/sh\necho %d\n"):format(uid))
  support.write(bin .. "/apt-get", ("#!/bin/sh\necho \"$@\" >> %s\n"):format(q(log)))
  os.execute("chmod +x " .. q(bin .. "/id") .. " " .. q(bin .. "/apt-get"))
  local build = require("remax.cli.main").build_dir()
  if build:sub(1, 1) ~= "/" then build = os.getenv("PWD") .. "/" .. build end
  local cmd = ("PATH=%s:$PATH REMAX_BUILD=%s REMAX_DNNL_HEADER=/nonexistent/dnnl.h %s ./remax version 2>&1"):format(
    q(bin), q(build), extra_env or "")
  local p = io.popen(cmd)
  local out = p:read("*a")
  local ok = p:close()
  return out, support.try_read(log) or "", ok
end

describe("./remax launcher", function()
  it("installs libdnnl-dev as root with apt-get, as .ci/run does", function()
    local ci = support.read(".ci/run")
    assert.matches("libdnnl%-dev", ci)   -- the package CI installs
    local out, apt, ok = launch(0)
    assert.is_true(ok == true or ok == 0, out)
    assert.matches("install %-y %-qq.*libdnnl%-dev", apt)
    assert.matches("remax: installing missing packages: libdnnl-dev", out, 1, true)
    assert.matches("remax %d+%.%d+", out)
  end)

  it("leaves it to the user when not root (or REMAX_NO_INSTALL is set)", function()
    local out, apt, ok = launch(1000)
    assert.is_true(ok == true or ok == 0, out)
    assert.are.equal("", apt)
    out, apt = launch(0, "REMAX_NO_INSTALL=1")
    assert.are.equal("", apt)
  end)
end)
