-- The channels to other programs (remax.step.channels) trust nothing. Issue 35, findings 4 and
-- 5: long answer lines, answers out of step with their requests, URLs, keep-alive and empty HTTP
-- answers, cmd: names, and the processes remax starts ending when remax ends (success, error,
-- Ctrl-C twice, SIGTERM before the trainer catches signals). Issue 45, family 1: every answer
-- bounded before it is kept, for rewards, tools and environments over py:, cmd: and HTTP alike,
-- and each fault failing that call only. Every wait here has its own bound.
local rewards = require("remax.step.rewards")
local rw = require("remax.step.reward_worker")
local http = require("remax.step.channels.http")
local cmd = require("remax.step.channels.cmd")
local ipc = require("remax.bind.ipc")
local support = require("support")
local write, has_python, error_of = support.write, support.has_python, support.error_of
local read = support.try_read
local q = support.shell_quote

-- Waits up to `seconds` for f() to be true; whether it became true.
local function eventually(seconds, f)
  local deadline = ipc.now() + seconds
  while ipc.now() < deadline do
    if f() then return true end
    ipc.sleep(0.05)
  end
  return f() and true or false
end

local function alive(pid)
  return os.execute("kill -0 " .. pid .. " 2>/dev/null") == 0
end

-- Processes a test started (servers, helpers), killed after each test (busted keeps one
-- `finally` per test, so they are listed here).
local started = {}
local function kill_later(pid) started[#started + 1] = pid end
local function kill_started()
  for _, pid in ipairs(started) do os.execute("kill -9 " .. pid .. " 2>/dev/null") end
  started = {}
end

local function batch3()
  return { "a", "bb", "ccc" }, { prompt = { "p1", "p2", "p3" }, answer = { "1", "2", "3" } }
end

-- A raw-socket HTTP server (python3) answering every POST with `reply` (a Python bytes
-- expression of the request's id) and keeping the connection open; returns its port.
local function raw_server(d, reply)
  write(d .. "/srv.py", ([[
import socket, sys, os, json
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0)); s.listen(8)
with open(sys.argv[1] + ".tmp", "w") as f: f.write("%%d %%d\n" %% (s.getsockname()[1], os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
conns = []
while True:
    c, _ = s.accept(); conns.append(c)   # never closed: a keep-alive server
    data = b""
    while b"\r\n\r\n" not in data: data += c.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    n = int([l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0])
    while len(body) < n: body += c.recv(65536)
    rid = json.loads(body)["id"]
    c.sendall(%s)
]]):format(reply))
  os.execute(("python3 %s %s >/dev/null 2>&1 &"):format(q(d .. "/srv.py"), q(d .. "/port")))
  local port, pid
  assert.is_true(eventually(10, function()
    local t = read(d .. "/port")
    if t then port, pid = t:match("(%d+) (%d+)") end
    return port ~= nil
  end), "the test server did not start")
  kill_later(pid)
  return port
end

describe("reward channels", function()
  if not has_python() then
    pending("python3 is not installed")
    return
  end
  after_each(kill_started)

  it("reads a 30 MB answer line in linear time, and stops a 100 MB one at reward_max_line_bytes naming the reward", function()
    local d = support.tmpdir()
    -- one valid answer line of 30 MB (a padding field), under a raised limit
    write(d .. "/big.py", [[
import sys, json
for line in sys.stdin:
    rid = json.loads(line)["id"]
    sys.stdout.write('{"id": %d, "pad": "' % rid + "x" * 30000000 + '", "scores": [1, 2, 3]}\n'); sys.stdout.flush()
]])
    local r = rewards.normalize("cmd:python3 " .. d .. "/big.py", 1, { max_line_bytes = 64 * 1024 * 1024 })
    local c, b = batch3()
    local t0 = ipc.now()
    assert.are.same({ 1, 2, 3 }, rewards.run_one(r, c, b, { timeout = 30 }))
    local took = ipc.now() - t0
    r.close()
    assert.is_true(took < 8, ("30 MB took %.1f s"):format(took))
    -- 100 MB without a newline, default limit: stopped after a few MiB, not after 100 MB
    write(d .. "/flood.py", [[
import sys
for line in sys.stdin:
    for _ in range(100): sys.stdout.write("y" * 1000000)
    sys.stdout.write("\n"); sys.stdout.flush()
]])
    local f = rewards.normalize("cmd:python3 " .. d .. "/flood.py", 1, {})
    t0 = ipc.now()
    local err = error_of(rewards.run_one, f, c, b, { timeout = 30, step = 4 })
    assert.is_true(ipc.now() - t0 < 10)
    assert.matches("reward 'flood' (cmd:python3 " .. d .. "/flood.py) at step 4", err, 1, true)
    assert.matches("longer than reward_max_line_bytes = " .. rw.MAX_LINE_BYTES .. " bytes", err, 1, true)
    assert.are.equal(4 * 1024 * 1024, rw.MAX_LINE_BYTES)
    assert.is_nil(f.impl.proc)   -- the worker is stopped
    f.close()
  end)

  it("reads lines split across reads and many lines in one read, keeping what follows", function()
    local p = ipc.spawn({ "/bin/sh", "-c", "printf 'ab'; sleep 0.2; printf 'c\\nd\\ne'; sleep 0.2; printf 'f\\n'" })
    local dl = ipc.now() + 5
    assert.are.equal("abc", p:read_line(dl))
    assert.are.equal("d", p:read_line(dl))
    assert.are.equal("ef", p:read_line(dl))
    local line, why = p:read_line(dl)
    assert.is_nil(line)
    assert.are.equal("closed", why)
    p:close()
    -- a line cut by a timeout goes on at the next read
    p = ipc.spawn({ "/bin/sh", "-c", "printf 'part'; sleep 0.5; printf 'rest\\n'" })
    line, why = p:read_line(ipc.now() + 0.2)
    assert.are.equal("timeout", why)
    assert.are.equal("partrest", p:read_line(ipc.now() + 5))
    p:close()
  end)

  it("stops when an answer carries another request's id: a program that answers twice", function()
    local d = support.tmpdir()
    write(d .. "/twice.py", [==[
import sys, json
for line in sys.stdin:
    req = json.loads(line)
    out = json.dumps({"id": req["id"], "scores": [len(c) for c in req["completions"]]})
    print(out); print(out); sys.stdout.flush()
]==])
    local r = rewards.normalize("cmd:python3 " .. d .. "/twice.py", 1, {})
    local c, b = batch3()
    assert.are.same({ 1, 2, 3 }, rewards.run_one(r, c, b, { timeout = 30, step = 1 }))
    local c2 = { "dddd", "e", "ff" }
    local err = error_of(rewards.run_one, r, c2, b, { timeout = 30, step = 2 })
    assert.matches("reward 'twice' (cmd:python3 " .. d .. "/twice.py) at step 2: answered id 1 a second time", err, 1, true)
    assert.matches("the answers are out of step with the requests (the worker is stopped", err, 1, true)
    r.close()
    -- an answer without the id
    write(d .. "/noid.py", [[
import sys, json
for line in sys.stdin:
    print(json.dumps({"scores": [1, 1, 1]})); sys.stdout.flush()
]])
    r = rewards.normalize("cmd:python3 " .. d .. "/noid.py", 1, {})
    err = error_of(rewards.run_one, r, c, b, { timeout = 30 })
    assert.matches("answered without a request id (on its way: request 1)", err, 1, true)
    r.close()
  end)

  it("parses reward URLs: port range, userinfo refused without showing it, clear messages", function()
    local function url_err(u) return error_of(rewards.normalize, u, 1, {}) end
    assert.matches("http://127.0.0.1:99999/score: port 99999 is out of range (1-65535)", url_err("http://127.0.0.1:99999/score"), 1, true)
    assert.matches("port 0 is out of range", url_err("http://127.0.0.1:0/score"), 1, true)
    assert.matches("is not a port", url_err("http://127.0.0.1:80x/score"), 1, true)
    assert.matches("no host", url_err("http://:8000/score"), 1, true)
    local e = url_err("http://user:s3cr3t@127.0.0.1:8000/score")
    assert.matches("a user name or password in the URL is not supported", e, 1, true)
    assert.matches("http://...@127.0.0.1:8000/score", e, 1, true)
    assert.is_nil(e:find("s3cr3t", 1, true))
    assert.is_nil(e:find("user:", 1, true))
    local host, port, path = http.parse_url("http://[::1]:8080/a/b?x=1")
    assert.are.same({ "::1", 8080, "/a/b?x=1" }, { host, port, path })
    host, port, path = http.parse_url("http://localhost")
    assert.are.same({ "localhost", 80, "/" }, { host, port, path })
    assert.are.equal(65535, select(2, http.parse_url("http://h:65535/")))
  end)

  it("reads a keep-alive server's answer at its Content-Length or last chunk, not at a close", function()
    local d = support.tmpdir()
    local port = raw_server(d, [[(lambda b: b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\nContent-Length: %d\r\n\r\n" % len(b) + b)(json.dumps({"id": rid, "scores": [1, 2, 3]}).encode())]])
    local r = rewards.normalize(("http://127.0.0.1:%s/score"):format(port), 1, {})
    local c, b = batch3()
    local t0 = ipc.now()
    assert.are.same({ 1, 2, 3 }, rewards.run_one(r, c, b, { timeout = 5 }))
    assert.is_true(ipc.now() - t0 < 2.5, "waited for the server to close the connection")
    local d2 = support.tmpdir()
    local port2 = raw_server(d2, [[(lambda b: b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % 5 + b[:5] + b"\r\n" + b"%x;ext=1\r\n" % (len(b) - 5) + b[5:] + b"\r\n0\r\n\r\n")(json.dumps({"id": rid, "scores": [4, 5, 6]}).encode())]])
    r = rewards.normalize(("http://127.0.0.1:%s/score"):format(port2), 1, {})
    t0 = ipc.now()
    assert.are.same({ 4, 5, 6 }, rewards.run_one(r, c, b, { timeout = 5 }))
    assert.is_true(ipc.now() - t0 < 2.5)
  end)

  it("names an empty answer: an empty HTTP body, an empty line from a program", function()
    local d = support.tmpdir()
    local port = raw_server(d, [[b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"]])
    local r = rewards.normalize(("http://127.0.0.1:%s/judge"):format(port), 1, {})
    local c, b = batch3()
    local err = error_of(rewards.run_one, r, c, b, { timeout = 5, step = 2 })
    assert.matches(("reward 'judge' (http://127.0.0.1:%s/judge) at step 2: answered HTTP/1.1 200 OK with an empty body"):format(port), err, 1, true)
    assert.is_nil(err:find("internal", 1, true))
    r = rewards.normalize("cmd:sh -c 'while read l; do echo; done'", 1, { })
    err = error_of(rewards.run_one, r, c, b, { timeout = 5 })
    assert.matches("answered nothing (an empty answer)", err, 1, true)
    r.close()
  end)

  it("names a cmd: reward after its program, not its last argument", function()
    assert.are.equal("score", cmd.program_name("./score.sh 3"))
    assert.are.equal("score", cmd.program_name("sh score.sh --k 3"))
    assert.are.equal("judge", cmd.program_name("python3 -u tools/judge.py --model x 3"))
    assert.are.equal("judge", cmd.program_name("python3 -m pkg.judge 3"))
    assert.are.equal("judge", cmd.program_name("MODE=fast /opt/bin/judge --threads 4"))
    assert.are.equal("score", rewards.normalize("cmd:./score.sh 3", 1, {}).name)
  end)
end)

-- A luajit process running `body` (Lua, with rewards and support's folder at hand) in the
-- background; returns its pid.
local function background_lua(d, body)
  write(d .. "/main.lua", [[
package.path = "lua/?.lua;lua/?/init.lua;tests/lua/?.lua;" .. package.path
local rewards = require("remax.step.rewards")
local signals = require("remax.bind.signals")
local D = ]] .. ("%q"):format(d) .. "\n" .. body)
  os.execute(("sh -c 'echo $$ > %s.tmp; mv %s.tmp %s; exec luajit %s' </dev/null >%s 2>&1 &"):format(
    q(d .. "/main.pid"), q(d .. "/main.pid"), q(d .. "/main.pid"), q(d .. "/main.lua"), q(d .. "/main.log")))
  local pid
  assert.is_true(eventually(10, function() pid = (read(d .. "/main.pid") or ""):match("%d+") return pid ~= nil end))
  kill_later(pid)
  return pid
end

-- The pid a reward's helper wrote to d/name.pid (waits for it).
local function helper_pid(d, name)
  local pid
  assert.is_true(eventually(20, function() pid = (read(d .. "/" .. name .. ".pid") or ""):match("%d+") return pid ~= nil end),
    "the reward's process did not start: " .. tostring(read(d .. "/main.log")))
  kill_later(pid)
  return pid
end

-- A py: reward that writes its pid to d/busy.pid, then is busy for five minutes.
local function busy_py(d)
  write(d .. "/busy.py", ([[
import os, time
def reward(completions, **kw):
    with open(%q + ".tmp", "w") as f: f.write(str(os.getpid()))
    os.rename(%q + ".tmp", %q)
    time.sleep(300)
    return [0.0] * len(completions)
]]):format(d .. "/busy.pid", d .. "/busy.pid", d .. "/busy.pid"))
end

describe("processes remax starts", function()
  if not has_python() then
    pending("python3 is not installed")
    return
  end
  after_each(kill_started)

  it("a cmd: program's background child ends when a run that succeeded ends", function()
    local d = support.tmpdir()
    write(d .. "/bg.sh", ([[
sleep 300 &
echo $! > %s.tmp; mv %s.tmp %s
while read line; do
  id=$(printf '%%s' "$line" | sed 's/.*"id": *\([0-9]*\).*/\1/')
  echo "{\"id\": $id, \"scores\": [1, 1, 1]}"
done
]]):format(q(d .. "/bg.pid"), q(d .. "/bg.pid"), q(d .. "/bg.pid")))
    local main = background_lua(d, [[
local r = rewards.normalize("cmd:sh " .. D .. "/bg.sh", 1, {})
local s = rewards.run_one(r, { "a", "b", "c" }, { prompt = { "1", "2", "3" } }, { timeout = 30 })
assert(s[1] == 1)
print("scored")
-- ends without closing the reward: exit must take the program's group with it
]])
    local child = helper_pid(d, "bg")
    assert.is_true(eventually(20, function() return not alive(main) end), "the run did not end")
    assert.matches("scored", read(d .. "/main.log"), 1, true)
    assert.is_true(eventually(3, function() return not alive(child) end), "the background child outlived the run")
  end)

  it("a busy py: worker ends at a double Ctrl-C, at SIGTERM before signals are caught, and at an error", function()
    for _, case in ipairs({ "double-ctrl-c", "sigterm-probe", "error" }) do
      local d = support.tmpdir()
      busy_py(d)
      local body
      if case == "double-ctrl-c" then
        body = [[
signals.install()   -- as a run does: the first Ctrl-C asks for a checkpoint, the second ends at once
local r = rewards.normalize("py:" .. D .. "/busy.py", 1, {})
rewards.run_one(r, { "a" }, { prompt = { "1" } }, { timeout = 600 })
]]
      elseif case == "sigterm-probe" then
        body = [[
local data = require("remax.formats.data")
local r = rewards.normalize("py:" .. D .. "/busy.py", 1, {})
rewards.probe({ r }, { { prompt = "p", answer = "1" } }, "rows", data.collate, 600)
]]
      else
        body = [[
local r = rewards.normalize("py:" .. D .. "/busy.py", 1, {})
r.send({ "a" }, { prompt = { "1" } }, { timeout = 600 })
while not io.open(D .. "/busy.pid") do require("remax.bind.ipc").sleep(0.05) end
error("the run fails")
]]
      end
      local main = background_lua(d, body)
      local worker = helper_pid(d, "busy")
      assert.is_true(alive(worker))
      if case == "double-ctrl-c" then
        os.execute("kill -INT " .. main)
        ipc.sleep(0.3)
        assert.is_true(alive(main), "one Ctrl-C must not end the run at once")
        os.execute("kill -INT " .. main)
      elseif case == "sigterm-probe" then
        os.execute("kill -TERM " .. main)
      end
      assert.is_true(eventually(10, function() return not alive(main) end), case .. ": remax did not end")
      assert.is_true(eventually(3, function() return not alive(worker) end), case .. ": the worker outlived remax")
    end
  end)
end)

-- A raw-socket HTTP server (python3) that calls `reply(c, head, req)` (Python, the body of that
-- function) for every POST: c the socket, head the request's head (bytes), req its JSON body.
-- Returns its URL base ("http://127.0.0.1:PORT").
local function script_server(d, reply)
  write(d .. "/srv.py", ([[
import socket, sys, os, json, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0)); s.listen(8)
OUT = sys.argv[1]
def reply(c, head, req):
%s
with open(OUT + ".tmp", "w") as f: f.write("%%d %%d\n" %% (s.getsockname()[1], os.getpid()))
os.rename(OUT + ".tmp", OUT)
def serve(c):
    data = b""
    while b"\r\n\r\n" not in data: data += c.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    n = int([l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0])
    while len(body) < n: body += c.recv(65536)
    try:
        reply(c, head, json.loads(body))
    except OSError:
        pass
import threading
conns = []
while True:
    c, _ = s.accept(); conns.append(c)   # closed by reply, or kept open
    threading.Thread(target=serve, args=(c,), daemon=True).start()
]]):format(reply:gsub("\n", "\n    "):gsub("^", "    ")))
  os.execute(("python3 %s %s >/dev/null 2>&1 &"):format(q(d .. "/srv.py"), q(d .. "/port")))
  local port, pid
  assert.is_true(eventually(10, function()
    local t = read(d .. "/port")
    if t then port, pid = t:match("(%d+) (%d+)") end
    return port ~= nil
  end), "the test server did not start")
  kill_later(pid)
  return "http://127.0.0.1:" .. port
end

local NO_ARGS = { type = "object", properties = {} }

-- tools.call on one tool of `spec` (and its registry): result, ok, seconds, kind.
local function call_tool(spec, timeout, max_line, args)
  local tools = require("remax.step.tools")
  local t, reg = tools.check({ it = { fn = spec, parameters = { type = "object", properties = { text = { type = "string" } } } } },
    "tools", { max_line = max_line })
  local r, ok, seconds, kind = tools.call(t, { name = "it", arguments = args or {} }, timeout, reg)
  return r, ok, seconds, kind, reg, t
end

describe("every answer from outside is bounded before it is buffered (issue 45, family 1)", function()
  if not has_python() then
    pending("python3 is not installed")
    return
  end
  after_each(kill_started)

  it("stops reading an endless HTTP body at reward_max_line_bytes, for a tool and for a reward", function()
    for _, framing in ipairs({ "to the close", "chunked" }) do
      local d = support.tmpdir()
      -- at most 64 MB, then the server says how much it could send before remax hung up
      local url = script_server(d, ([[
chunked = %s
c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + (b"Transfer-Encoding: chunked\r\n" if chunked else b"") + b"\r\n")
sent, piece = 0, b"x" * 65536
try:
    while sent < 64 * 2**20:
        c.sendall((b"10000\r\n" + piece + b"\r\n") if chunked else piece)
        sent += len(piece)
except OSError:
    pass
with open(OUT + ".sent", "a") as f: f.write("%%d\n" %% sent)
c.close()
]]):format(framing == "chunked" and "True" or "False"))
      local t0 = ipc.now()
      local r, ok, _, kind = call_tool(url .. "/flood", 30, 1024 * 1024)
      assert.is_false(ok)
      assert.are.equal("worker", kind)
      assert.matches("Error: tool 'it' failed: the server " .. url .. "/flood answered a body longer than reward_max_line_bytes = 1048576 bytes", r, 1, true)
      local reward = rewards.normalize(url .. "/flood", 1, { max_line_bytes = 1024 * 1024 })
      local c, b = batch3()
      local err = error_of(rewards.run_one, reward, c, b, { timeout = 30, step = 5 })
      assert.matches("reward 'flood' (" .. url .. "/flood) at step 5: answered a body longer than reward_max_line_bytes = 1048576 bytes", err, 1, true)
      assert.is_true(ipc.now() - t0 < 10, framing)
      -- remax hung up after about a MiB (plus what the sockets held), twice: it did not read the 64 MB
      local sent
      assert.is_true(eventually(10, function()
        local text = read(d .. "/port.sent") or ""
        sent = {}
        for n in text:gmatch("%d+") do sent[#sent + 1] = tonumber(n) end
        return #sent == 2
      end), "the server did not finish")
      for _, n in ipairs(sent) do assert.is_true(n < 32 * 2 ^ 20, framing .. ": the server sent " .. n .. " bytes") end
    end
  end)

  it("refuses a Content-Length over the limit at once, naming it, and not as a timeout", function()
    local d = support.tmpdir()
    local url = script_server(d, [[
c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n{\"id\": 1")
time.sleep(30)
]])
    local t0 = ipc.now()
    local r, ok, _, kind = call_tool(url .. "/big", 20)
    assert.is_true(ipc.now() - t0 < 5, "waited for the body")
    assert.are.same({ false, "worker" }, { ok, kind })
    assert.matches("answered a body of 100000000 bytes (its Content-Length), longer than reward_max_line_bytes = 4194304 bytes", r, 1, true)
    local err = error_of(rewards.run_one, rewards.normalize(url .. "/big", 1, {}), { "a" }, { prompt = { "p" } }, { timeout = 20 })
    assert.matches("answered a body of 100000000 bytes (its Content-Length)", err, 1, true)
    assert.is_true(ipc.now() - t0 < 10)
  end)

  it("fails only the call whose chunked answer has a malformed chunk-size line", function()
    local d = support.tmpdir()
    local url = script_server(d, [[
if b"/bad" in head.split(b"\r\n")[0]:
    c.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")
elif b"/moved" in head.split(b"\r\n")[0]:
    c.sendall(b"HTTP/1.1 301 Moved Permanently\r\nLocation: http://127.0.0.1:1/new\r\nContent-Length: 0\r\n\r\n")
else:
    b = json.dumps({"id": req["id"], "result": "fine", "scores": [1]}).encode()
    c.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % len(b) + b + b"\r\n0\r\n\r\n")
c.close()
]])
    local tools = require("remax.step.tools")
    local t, reg = tools.check({ bad = { fn = url .. "/bad", parameters = NO_ARGS }, good = { fn = url .. "/good", parameters = NO_ARGS } })
    finally(function() reg:close() end)
    local r, ok, _, kind = tools.call(t, { name = "bad", arguments = {} }, 10, reg)
    assert.are.same({ false, "worker" }, { ok, kind })
    assert.matches("Error: tool 'bad' failed: the server " .. url .. "/bad answered a chunked body with a malformed chunk-size line: \"zz\"", r, 1, true)
    assert.are.same({ "fine", true }, { (tools.call(t, { name = "good", arguments = {} }, 10, reg)), true })
    local err = error_of(rewards.run_one, rewards.normalize(url .. "/bad", 1, {}), { "a" }, { prompt = { "p" } }, { timeout = 10, step = 3 })
    assert.matches("reward 'bad' (" .. url .. "/bad) at step 3: answered a chunked body with a malformed chunk-size line", err, 1, true)
    assert.is_nil(err:find("internal", 1, true))
    assert.is_nil(err:find("tonumber", 1, true))
    -- a redirect with an empty body says where to, and that remax does not follow it (a message
    -- that ended in ":" read as a bug in remax)
    err = error_of(rewards.run_one, rewards.normalize(url .. "/moved", 1, {}), { "a" }, { prompt = { "p" } }, { timeout = 10 })
    assert.matches("answered HTTP/1.1 301 Moved Permanently with an empty body (to http://127.0.0.1:1/new; remax does not follow redirects: give that URL)", err, 1, true)
  end)

  it("reports a worker that died as dead and starts it again, though a process it started holds its pipes", function()
    local d = support.tmpdir()
    write(d .. "/dies.py", ([[
import os, subprocess
def spawn_and_die(text: str = "") -> str:
    """A tool of the test.

    Args:
        text: unused
    """
    p = subprocess.Popen(["sleep", "300"])   # inherits the worker's stdout, and holds it open
    with open(%q, "w") as f: f.write(str(p.pid))
    os._exit(3)
def ok(text: str = "") -> str:
    """A tool of the test.

    Args:
        text: unused
    """
    return "fine"
def reward(completions, **kw):
    if not os.path.exists(%q):
        open(%q, "w").close()
        spawn_and_die()
    return [0.5] * len(completions)
]]):format(d .. "/sleep.pid", d .. "/died", d .. "/died"))
    local tools = require("remax.step.tools")
    local t, reg = tools.check({ "py:" .. d .. "/dies.py:spawn_and_die", "py:" .. d .. "/dies.py:ok" })
    finally(function() reg:close() end)
    local t0 = ipc.now()
    local r, ok, _, kind = tools.call(t, { name = "spawn_and_die", arguments = {} }, 30, reg)
    assert.is_true(ipc.now() - t0 < 5, ("took %.1f s: reported as slow, not as dead"):format(ipc.now() - t0))
    assert.are.same({ false, "worker" }, { ok, kind })
    assert.matches("Error: tool 'spawn_and_die' failed: the worker py:" .. d .. "/dies.py died (exit status 3)", r, 1, true)
    local sleeper = helper_pid(d, "sleep")
    assert.is_true(eventually(3, function() return not alive(sleeper) end), "the process it started outlived it")
    assert.are.same({ "fine", true }, { (tools.call(t, { name = "ok", arguments = {} }, 30, reg)), true })   -- started again
    -- killed while idle (no request on its way): the next call starts it afresh and is answered
    os.execute("kill -9 " .. select(2, next(reg.channels)).proc.pid)
    assert.is_true(eventually(3, function() return not select(2, next(reg.channels)).proc:running() end))
    assert.are.same({ "fine", true }, { (tools.call(t, { name = "ok", arguments = {} }, 30, reg)), true })
    -- a reward: restarted once, and the batch answered by the new worker
    t0 = ipc.now()
    local reward = rewards.normalize("py:" .. d .. "/dies.py", 1, {})
    assert.are.same({ 0.5, 0.5, 0.5 }, rewards.run_one(reward, { "a", "b", "c" }, { prompt = { "1", "2", "3" } }, { timeout = 60 }))
    assert.is_true(ipc.now() - t0 < 10)
    reward.close()
  end)

  it("reports an answer with an id remax never sent at once, not as a timeout", function()
    local d = support.tmpdir()
    write(d .. "/wrong.py", [[
import sys, json
for line in sys.stdin:
    req = json.loads(line)
    print(json.dumps({"id": req["id"] + 1000, "result": "x", "scores": [1]}), flush=True)
]])
    local t0 = ipc.now()
    local r, ok, _, kind, reg = call_tool("cmd:python3 " .. d .. "/wrong.py", 30)
    reg:close()
    assert.is_true(ipc.now() - t0 < 5, "waited for the timeout")
    assert.are.same({ false, "worker" }, { ok, kind })
    assert.matches("the worker cmd:python3 " .. d .. "/wrong.py answered id 1001, which remax never sent (on its way: request 1) (the worker is stopped)", r, 1, true)
    local err = error_of(rewards.run_one, rewards.normalize("cmd:python3 " .. d .. "/wrong.py", 1, {}), { "a" }, { prompt = { "p" } },
      { timeout = 30 })
    assert.matches("answered id 1001, which remax never sent (on its way: request 1)", err, 1, true)
    assert.is_true(ipc.now() - t0 < 10)
  end)

  it("reads a lone surrogate of Python text as U+FFFD, and keeps the worker", function()
    local wire = require("remax.step.channels.wire")
    assert.are.equal([["a\ufffdb\ufffd"]], wire.fix_surrogates([["a\udc80b\ud800"]]))
    assert.are.equal([["\ud83d\ude00 \\udc80 \ufffd\ufffd"]], wire.fix_surrogates([["\ud83d\ude00 \\udc80 \ude00\ud83d"]]))
    local d = support.tmpdir()
    write(d .. "/text.py", [[
import os
def name(text: str = "") -> str:
    """A tool of the test.

    Args:
        text: unused
    """
    return os.fsdecode(b"caf\xe9") + " \U0001F600"   # a file name that is not UTF-8: 'caf\udce9'
def env_text(text: str = "") -> str:
    """A tool of the test.

    Args:
        text: unused
    """
    return "ok"
class Env:
    def reset(self, **row):
        return "hello \udc80"
    def step(self, text):
        return "bye \ud800", True, 1.0
]])
    local tools = require("remax.step.tools")
    local t, reg = tools.check({ "py:" .. d .. "/text.py:name", "py:" .. d .. "/text.py:env_text" })
    finally(function() reg:close() end)
    assert.are.same({ "caf\239\191\189 \240\159\152\128", true }, { (tools.call(t, { name = "name", arguments = {} }, 30, reg)), true })
    local pid = select(2, next(reg.channels)).proc.pid
    assert.are.same({ "ok", true }, { (tools.call(t, { name = "env_text", arguments = {} }, 30, reg)), true })
    assert.are.equal(pid, select(2, next(reg.channels)).proc.pid)   -- the same worker
    local environment = require("remax.step.environment")
    local env = environment.check("py:" .. d .. "/text.py:Env", "environment", { registry = reg })
    local inst = environment.instance(env, { prompt = "p" })
    local msgs = environment.reset_finish(reg:wait(environment.reset_start(inst, { prompt = "p" }, reg, 30)), { prompt = "p" }, 30)
    assert.are.equal("hello \239\191\189", msgs[1].content)
    local obs, done, reward = environment.step_finish(reg:wait(environment.step_start(inst, "x", reg, 30)), 30)
    assert.are.same({ "bye \239\191\189", true, 1.0 }, { obs[1].content, done, reward })
  end)

  it("gives every channel the same limit and the same message, and fails only that call", function()
    -- each kind (py:, cmd:, http://) serving a reward, a tool and an environment, with
    -- reward_max_line_bytes = 100: a long answer fails that call, the next short one is answered
    local d = support.tmpdir()
    write(d .. "/serve.py", [[
def answer(req):
    t, long = req.get("type"), "x" * 200
    if t == "reward":
        return {"id": req["id"], "scores": [1.0] * len(req["completions"]), "pad": long if len(req["completions"]) > 1 else None}
    if t == "tool":
        return {"id": req["id"], "result": long if req["arguments"].get("long") else "short"}
    if t == "reset":
        return {"id": req["id"], "messages": long if req["sample"].get("long") else "hi"}
    return {"id": req["id"]}
]])
    write(d .. "/cmd.py", [[
import sys, json
sys.path.insert(0, sys.argv[1])
from serve import answer
for line in sys.stdin:
    print(json.dumps(answer(json.loads(line))), flush=True)
]])
    write(d .. "/lib.py", [[
def reward(completions, **kw):
    return [1.0] * len(completions)
def tool(long: bool = False) -> str:
    return "x" * 200 if long else "short"
class Env:
    def reset(self, long=False, **row):
        return "x" * 200 if long else "hi"
    def step(self, text):
        return "done", True, 0.0
]])
    local url = script_server(d, [[
import importlib.util
sys.path.insert(0, os.path.dirname(OUT))
from serve import answer
b = json.dumps(answer(req)).encode()
c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(b) + b)
c.close()
]])
    local environment = require("remax.step.environment")
    local tools = require("remax.step.tools")
    local LIMIT = "longer than reward_max_line_bytes = 100 bytes"
    for _, kind in ipairs({ "py", "cmd", "http" }) do
      local spec = ({ py = "py:" .. d .. "/lib.py", cmd = "cmd:python3 " .. d .. "/cmd.py " .. d, http = url .. "/x" })[kind]
      -- a reward: 30 completions make a long answer, one a short one
      local r = rewards.normalize(spec, 1, { max_line_bytes = 100 })
      local many = {}
      for i = 1, 30 do many[i] = "c" end
      local err = error_of(rewards.run_one, r, many, {}, { timeout = 30 })
      assert.matches(LIMIT, err, 1, true)
      assert.are.same({ 1 }, rewards.run_one(r, { "c" }, {}, { timeout = 30 }))
      r.close()
      -- a tool
      local tspec = kind == "py" and (spec .. ":tool") or spec
      local params = { type = "object", properties = { long = { type = "boolean" } } }
      local t, reg = tools.check({ tool = { fn = tspec, parameters = params } }, "tools", { max_line = 100 })
      local res, ok = tools.call(t, { name = "tool", arguments = { long = true } }, 30, reg)
      assert.is_false(ok)
      assert.matches(LIMIT, res, 1, true)
      assert.are.same({ "short", true }, { (tools.call(t, { name = "tool", arguments = {} }, 30, reg)), true })
      -- an environment
      local env = environment.check(kind == "py" and (spec .. ":Env") or spec, "environment", { registry = reg })
      local function reset(row)
        local inst = environment.instance(env, row)
        return environment.reset_finish(reg:wait(environment.reset_start(inst, row, reg, 30)), row, 30)
      end
      local msgs, why = reset({ prompt = "p", long = true })
      assert.is_nil(msgs)
      assert.matches("environment reset failed: .*" .. LIMIT:gsub("%p", "%%%0"), why)
      assert.are.equal("hi", reset({ prompt = "p" })[1].content, kind)
      reg:close()
    end
  end)
end)

describe("tools give back what they cannot send as a call's error (issue 45, family 3)", function()
  it("a Lua tool returning a table that contains itself gets an error result naming the tool", function()
    local tools = require("remax.step.tools")
    local t = tools.check({ loop = { fn = function() local x = {} x.self = x return x end } })
    local r, ok, _, kind = tools.call(t, { name = "loop", arguments = {} }, 5)
    assert.are.same({ false, "error" }, { ok, kind })
    assert.matches("Error: tool 'loop' failed: it returned what cannot be written as JSON: its result.self.self", r, 1, true)
    assert.matches("(a cycle?)", r, 1, true)
  end)
end)

describe("the channels' own bounds", function()
  it("bounds an HTTP head at 64 KiB, 1xx answers included, and reads a body split anywhere", function()
    local http = require("remax.step.channels.http")
    local p = http.parser(1024)
    local ok, err = pcall(function()
      for _ = 1, 100 do p:feed("HTTP/1.1 100 Continue\r\nX-Pad: " .. ("y"):rep(1000) .. "\r\n\r\n") end
    end)
    assert.is_false(ok)
    assert.matches("answered a status line and headers longer than 65536 bytes", err.why, 1, true)
    -- a body split at every byte: the same answer
    local text = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=1\r\nabc\r\n2\r\nde\r\n0\r\nT: 1\r\n\r\n"
    p = http.parser(1024)
    local body
    for i = 1, #text do body = body or p:feed(text:sub(i, i)) end
    assert.are.equal("abcde", body)
  end)

  it("never waits to hand a worker a request: a large batch to a program that is not reading", function()
    if not has_python() then pending("python3 is not installed") return end
    local d = support.tmpdir()
    write(d .. "/late.py", [==[
import sys, json, time
time.sleep(2)   # not reading its input yet
for line in sys.stdin:
    req = json.loads(line)
    print(json.dumps({"id": req["id"], "scores": [len(c) for c in req["completions"]]}), flush=True)
]==])
    local r = rewards.normalize("cmd:python3 " .. d .. "/late.py", 1, {})
    local big = {}
    for i = 1, 40 do big[i] = ("z"):rep(100000) end   -- 4 MB: far more than a pipe holds
    local t0 = ipc.now()
    r.send(big, {}, { timeout = 30 })
    assert.is_true(ipc.now() - t0 < 1, ("send waited %.1f s"):format(ipc.now() - t0))
    local scores = rewards.run_one(r, big, {}, { timeout = 30 })
    assert.are.equal(100000, scores[40])
    r.close()
  end)
  it("Ctrl-C or SIGTERM while a worker computes ends the wait after the grace, naming the worker", function()
    local channels = require("remax.step.channels")
    local guard = require("remax.step.guard")
    local reg = channels.registry({})
    local ch = reg:channel("cmd:sleep 30")
    local h = reg:request(ch, { type = "reward" }, 60)   -- a minute's timeout: the signal must end it first
    local saved_pending, saved_grace = guard.signal_pending, guard.SIGNAL_GRACE
    local t0 = ipc.now()
    guard.signal_pending = function() return ipc.now() - t0 > 0.3 end
    guard.SIGNAL_GRACE = 0.2
    local ok, err = pcall(reg.wait, reg, h)
    guard.signal_pending, guard.SIGNAL_GRACE = saved_pending, saved_grace
    local waited = ipc.now() - t0
    reg:close()
    assert.is_false(ok)
    assert.is_true(guard.is_interrupt(err), tostring(err))
    assert.matches("interrupted (Ctrl-C or SIGTERM) while the worker cmd:sleep 30 ran", tostring(err), 1, true)
    assert.is_true(waited >= 0.5 and waited < 5, "waited " .. waited .. " s")
    -- without a signal the same wait ends at the request's own timeout, as before
    reg = channels.registry({})
    h = reg:request(reg:channel("cmd:sleep 30"), { type = "reward" }, 0.5)
    reg:wait(h)
    reg:close()
    assert.are.equal("timeout", h.kind)
  end)
end)
