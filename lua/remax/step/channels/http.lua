-- remax.step.channels.http: "http://HOST[:PORT]/PATH", a server that gets each request as one
-- POST with a JSON body and answers the JSON answer. Each request has its own connection
-- (Connection: close), read without blocking as bytes arrive by a parser that bounds
-- everything before it keeps it: the status line and headers together at most 64 KiB, the body
-- at most max_line bytes (a Content-Length over it is refused at once, a chunked or
-- read-to-the-close body when it grows past it). The body ends at its Content-Length or last
-- chunk, so a keep-alive server is answered at once. A connection refused is tried once more
-- (every request); one that fails after the request went out is tried once more only for
-- requests that may be sent twice (rewards: opts.idempotent). URLs are checked when the channel
-- opens: port 1-65535, a host, no user name or password (refused, and never shown), no https.
local ipc = require("remax.bind.ipc")
local wire = require("remax.step.channels.wire")

local M = {}

M.HEAD_BYTES = 64 * 1024   -- the most bytes of a response's status line and headers (and trailers)

-- "http://host[:port]/path" -> host, port, path; or raises what is wrong with it (never
-- showing a user name or password; the caller names the URL, through M.display).
function M.parse_url(url)
  if url:match("^[Hh][Tt][Tt][Pp][Ss]://") then
    error("https is not supported (the engine has no TLS); serve it on http:// (localhost, or through a local proxy)", 0)
  end
  local rest = url:match("^[Hh][Tt][Tt][Pp]://(.*)$")
  if not rest then error("expected http://HOST[:PORT]/PATH", 0) end
  local stop = rest:find("[/?#]") or #rest + 1
  local authority, path = rest:sub(1, stop - 1), rest:sub(stop)
  if authority:find("@", 1, true) then
    error("a user name or password in the URL is not supported (it would travel in clear text); pass credentials another way (a header-adding local proxy, or the server's own configuration)", 0)
  end
  path = path:gsub("#.*$", "")
  if path == "" then path = "/" elseif path:sub(1, 1) == "?" then path = "/" .. path end
  if path:find("[%s%c]") then error("the path has a space or control character; escape it (%20)", 0) end
  local host, port_text
  if authority:sub(1, 1) == "[" then
    host, port_text = authority:match("^%[([%x:%.]+)%](.*)$")
    if not host then error(("'%s' is not an IPv6 address in brackets"):format(authority), 0) end
  else
    host, port_text = authority:match("^([^:]*)(.*)$")
  end
  if host == "" then error("no host; expected http://HOST[:PORT]/PATH", 0) end
  if not host:match("^[%w%.%-_:]+$") then error(("'%s' is not a host name or address"):format(host), 0) end
  local port = 80
  if port_text ~= "" then
    local digits = port_text:match("^:(%d+)$")
    if not digits then error(("'%s' after the host is not a port; expected :PORT with PORT in 1-65535"):format(port_text), 0) end
    port = tonumber(digits)
    if #digits > 5 or port < 1 or port > 65535 then error(("port %s is out of range (1-65535)"):format(digits), 0) end
  end
  return host, port, path
end

-- The URL as messages show it (a user name or password never).
function M.display(url) return (url:gsub("^([Hh][Tt][Tt][Pp][Ss]?://)[^/@]*@", "%1...@")) end

---------------------------------------------------------------------------------------------
-- The response parser: fed bytes as they come; each step bounded.

local Parser = {}
Parser.__index = Parser

-- limit: the most bytes of the body.
function M.parser(limit)
  return setmetatable({ limit = limit, buf = "", pos = 1, state = "head", head = 0, parts = {}, have = 0 }, Parser)
end

local function bad(why) error({ why = why }, 0) end

-- The next line (without CRLF; a bare LF too), or nil when it has not all come. Lines count
-- against HEAD_BYTES.
function Parser:line()
  local e = self.buf:find("\n", self.pos, true)
  if not e then
    if self.head + (#self.buf - self.pos + 1) > M.HEAD_BYTES then
      bad(("answered a status line and headers longer than %d bytes"):format(M.HEAD_BYTES))
    end
    return nil
  end
  self.head = self.head + (e - self.pos + 1)
  if self.head > M.HEAD_BYTES then bad(("answered a status line and headers longer than %d bytes"):format(M.HEAD_BYTES)) end
  local l = self.buf:sub(self.pos, e - 1):gsub("\r$", "")
  self.pos = e + 1
  return l
end

-- Up to n body bytes from the buffer: how many it took.
function Parser:take(n)
  local k = math.min(n, #self.buf - self.pos + 1)
  if k > 0 then
    self.parts[#self.parts + 1] = self.buf:sub(self.pos, self.pos + k - 1)
    self.pos = self.pos + k
  end
  return k
end

function Parser:grow(n)
  if self.have + n > self.limit then
    bad(("answered a body longer than reward_max_line_bytes = %d bytes"):format(self.limit))
  end
  self.have = self.have + n
end

-- The response's head is complete: where its body ends.
function Parser:headers_done()
  local code, h = self.code, self.headers
  if code < 200 and code ~= 101 then   -- 100 Continue and other 1xx: the real answer follows
    self.state, self.headers = "head", nil
    return
  end
  local te, cl = h["transfer-encoding"], h["content-length"]
  if te and te:lower():find("chunked", 1, true) then
    self.state = "chunk_size"
  elseif cl then
    local len = cl:match("^%d+$") and tonumber(cl)
    if not len then bad(("answered Content-Length: %s, which is not a byte count"):format(wire.clip(cl, 40))) end
    if len > self.limit then
      bad(("answered a body of %d bytes (its Content-Length), longer than reward_max_line_bytes = %d bytes"):format(len, self.limit))
    end
    self.have, self.need, self.state, self.length = len, len, "data", len
    self.after = "done"
  elseif code == 204 or code == 304 then
    self.state = "done"
  else
    self.state = "to_close"
  end
end

-- Works through the buffer as far as it goes.
function Parser:run()
  while true do
    local st = self.state
    if st == "head" then
      local l = self:line()
      if not l then return end
      if not self.headers then
        local code = tonumber(l:match("^HTTP/%d[%.%d]* (%d%d%d)"))
        if not code then bad(("answered something that is not HTTP: %s"):format(wire.clip(l, 200))) end
        self.status, self.code, self.headers = l, code, {}
      elseif l == "" then
        self:headers_done()
      else
        local k, v = l:match("^([^:]+):%s*(.-)%s*$")
        if k then self.headers[k:lower()] = v end
      end
    elseif st == "data" then
      self.need = self.need - self:take(self.need)
      if self.need > 0 then return end
      self.state = self.after
    elseif st == "chunk_size" then
      local l = self:line()
      if not l then return end
      local digits = l:match("^%s*(%x+)%s*$") or l:match("^%s*(%x+)%s*;")
      if not digits then
        bad(("answered a chunked body with a malformed chunk-size line: %s (expected a hexadecimal byte count)")
          :format(("%q"):format(wire.clip(l, 60))))
      end
      local size = tonumber(digits, 16)
      if size == 0 then
        self.state = "trailer"
      else
        self:grow(size)
        self.need, self.state, self.after = size, "data", "chunk_end"
      end
    elseif st == "chunk_end" then
      local l = self:line()
      if not l then return end
      if l ~= "" then bad("answered a chunked body whose chunk is longer than its size line says") end
      self.state = "chunk_size"
    elseif st == "trailer" then
      local l = self:line()
      if not l then return end
      if l == "" then self.state = "done" end
    elseif st == "to_close" then
      local n = #self.buf - self.pos + 1
      self:grow(n)
      self:take(n)
      return
    else
      return
    end
  end
end

-- Feeds bytes: the body once the answer is complete, or nil (more to come), or raises {why}.
function Parser:feed(data)
  if self.pos > #self.buf then self.buf = data else self.buf = self.buf:sub(self.pos) .. data end
  self.pos = 1
  self:run()
  if self.state == "done" then return self:body() end
end

-- The server closed the connection: the body, or raises {why}.
function Parser:close()
  if self.state == "to_close" or self.state == "done" then return self:body() end
  if self.state == "head" and not self.headers and self.head == 0 and self.pos > #self.buf then
    bad("closed the connection without answering")
  end
  if self.state == "head" then bad("closed the connection in the middle of the headers") end
  local came = 0
  for _, part in ipairs(self.parts) do came = came + #part end
  bad(("closed the connection in the middle of the body (%d of %s bytes came)"):format(came,
    self.length and tostring(self.length) or "more"))
end

function Parser:body()
  local body = table.concat(self.parts)
  if self.code < 200 or self.code > 299 then
    if body:match("^%s*$") then
      local hint = (self.code >= 300 and self.code < 400 and self.headers.location)
        and (" (to %s; remax does not follow redirects: give that URL)"):format(wire.clip(self.headers.location, 200)) or ""
      bad(("answered %s with an empty body%s"):format(self.status, hint))
    end
    bad(("answered %s: %s"):format(self.status, wire.clip(body, 300)))
  end
  if body:match("^%s*$") then
    bad(("answered %s with an empty body; expected one JSON object with the request's \"id\""):format(self.status))
  end
  return body
end

-- parser:feed / parser:close as body, or nil and why.
local function run(parser, method, data)
  local ok, body = pcall(parser[method], parser, data)
  if ok then return body end
  if type(body) == "table" then return nil, body.why end
  error(body, 0)
end

---------------------------------------------------------------------------------------------
-- The channel.

local Server = {}
Server.__index = Server

-- Parses a spec for the registry: the key of its channel (the URL).
function M.key(spec)
  M.parse_url(spec)
  return spec
end

-- o: max_line. Raises when the URL is not one remax can post to.
function M.open(spec, o)
  local host, port, path = M.parse_url(spec)
  return setmetatable({ spec = spec, label = "the server " .. M.display(spec), host = host, port = port, path = path,
    max_line = o.max_line, pending = {}, last_id = 0 }, Server)
end

function Server:new_id()
  self.last_id = self.last_id + 1
  return self.last_id
end

local function fail(self, h, err, kind)
  self.pending[h.id] = nil
  if h.http and h.http.conn then h.http.conn:close() end
  wire.finish(h, nil, err, kind)
end

-- One try: connects and posts h's body.
function Server:connect(h)
  local st = h.http
  st.tries, st.retry_at, st.conn = st.tries + 1, nil, nil
  local deadline = h.deadline or (ipc.now() + 30)
  local twice = st.tries > 1 and " (tried twice)" or ""
  local conn, why = ipc.connect(self.host, self.port, deadline)
  if not conn then
    if why == "connection timed out" then return fail(self, h, ("cannot connect to %s:%d (%s)"):format(self.host, self.port, why), "timeout") end
    if st.tries < 2 then st.retry_at = ipc.now() + 0.2; return end
    return fail(self, h, ("cannot connect to %s:%d (%s)%s"):format(self.host, self.port, why, twice), "worker")
  end
  local host_header = self.host:find(":", 1, true) and ("[" .. self.host .. "]") or self.host
  local head = ("POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" ..
    "Accept: application/json\r\nConnection: close\r\nUser-Agent: remax\r\n\r\n"):format(self.path, host_header, self.port, #h.line)
  local ok, werr = conn:write(head .. h.line, deadline)
  if not ok then
    conn:close()
    if werr == "timeout" then return fail(self, h, ("%s did not take the request within its time"):format(self.label), "timeout") end
    return self:lost(h, ("the connection to %s:%d failed while sending (%s)"):format(self.host, self.port, werr))
  end
  st.conn, st.parser = conn, M.parser(self.max_line)
end

-- The connection failed after the request went out: once more when it may be sent twice.
function Server:lost(h, why)
  local st = h.http
  if st.conn then st.conn:close(); st.conn = nil end
  if h.idempotent and st.tries < 2 then st.retry_at = ipc.now() + 0.2; return end
  fail(self, h, why .. (st.tries > 1 and " (tried twice)" or ""), "worker")
end

-- Sends h (its id and line set). Never raises; a failure finishes h.
function Server:send(h)
  self.pending[h.id] = h
  h.http = { tries = 0 }
  self:connect(h)
end

-- The answer's body came: h gets it, if it is its answer.
local function answered(self, h, body)
  self.pending[h.id] = nil
  h.http.conn:close()
  local v, why = wire.decode(body)
  if not v then return wire.finish(h, nil, self.label .. " " .. why, "worker") end
  local id = v.id
  if id == h.id then return wire.resolve(h, v) end
  if (id == nil or id == wire.null) and v.error ~= nil then return wire.resolve(h, v) end   -- one connection, one request
  if id == nil or id == wire.null then
    return wire.finish(h, nil, ("%s answered without a request id (on its way: request %d): each answer must echo the \"id\" of its request; got %s")
      :format(self.label, h.id, wire.clip(body, 200)), "worker")
  end
  wire.finish(h, nil, ("%s answered id %s to request id %d"):format(self.label, wire.show(id), h.id), "worker")
end

local function read(self, h)
  local st = h.http
  while true do
    local chunk, why = st.conn:read_some(ipc.now())
    if not chunk then
      if why == "timeout" then return end
      if why ~= "closed" then return self:lost(h, ("the connection to %s:%d failed (%s)"):format(self.host, self.port, why)) end
      local body, bad_why = run(st.parser, "close")
      if body then return answered(self, h, body) end
      if bad_why == "closed the connection without answering" then
        return self:lost(h, ("%s %s"):format(self.label, bad_why))
      end
      return fail(self, h, ("%s %s"):format(self.label, bad_why), "worker")
    end
    local body, bad_why = run(st.parser, "feed", chunk)
    if body then return answered(self, h, body) end
    if bad_why then return fail(self, h, ("%s %s"):format(self.label, bad_why), "worker") end
  end
end

-- Reads what has arrived on every connection, without waiting; tries again what is due.
function Server:poll()
  local now = ipc.now()
  for _, h in pairs(self.pending) do
    local st = h.http
    if st.retry_at then
      if now >= st.retry_at then self:connect(h) end
    elseif st.conn then
      read(self, h)
    end
  end
end

function Server:forget(h)
  if self.pending[h.id] == h then
    self.pending[h.id] = nil
    if h.http and h.http.conn then h.http.conn:close() end
  end
end

function Server:busy() return next(self.pending) ~= nil end

function Server:waitables()
  local list = {}
  for _, h in pairs(self.pending) do if h.http.conn then list[#list + 1] = h.http.conn end end
  return list, {}
end

function Server:stop(why)
  for _, h in pairs(self.pending) do fail(self, h, ("%s: %s"):format(self.label, why or "stopped"), "worker") end
end

function Server:close()
  for _, h in pairs(self.pending) do fail(self, h, "the connection was closed", "worker") end
end

return M
