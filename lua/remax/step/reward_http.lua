-- remax.step.reward_http: the HTTP/1.1 client of reward servers ("http://" rewards of
-- remax.step.reward_worker): URLs checked (port 1-65535, no user name or password, never shown),
-- one POST per batch, the answer read to its Content-Length or last chunk (so a keep-alive
-- server answers at once), at most a limit of bytes. Over remax.bind.ipc's TCP connections.
local ipc = require("remax.bind.ipc")

local M = {}

-- The most bytes of a body when no limit is given (reward_max_line_bytes' default).
M.MAX_LINE_BYTES = 4 * 1024 * 1024

local function clip(s, n)
  s = tostring(s)
  n = n or 400
  return #s > n and (s:sub(1, n) .. "...") or s
end

-- "http://host[:port]/path" -> host, port, path. A port outside 1-65535, a user name or
-- password (refused; the message never shows it), an empty host are errors naming the URL.
local function parse_url(url)
  if url:match("^[Hh][Tt][Tt][Pp][Ss]://") then
    error(("%s: https is not supported (the engine has no TLS); serve the reward on http:// (localhost, or through a local proxy)")
      :format(url), 0)
  end
  local rest = url:match("^[Hh][Tt][Tt][Pp]://(.*)$")
  if not rest then error(("%s: expected http://HOST[:PORT]/PATH"):format(url), 0) end
  local stop = rest:find("[/?#]") or #rest + 1
  local authority, path = rest:sub(1, stop - 1), rest:sub(stop)
  if authority:find("@", 1, true) then
    -- never echo the user name or password: name the URL with them cut out
    local shown = "http://...@" .. authority:match("@([^@]*)$") .. path
    error(("%s: a user name or password in the URL is not supported (it would travel in clear text); pass credentials another way (a header-adding local proxy, or the server's own configuration)")
      :format(shown), 0)
  end
  path = path:gsub("#.*$", "")
  if path == "" then path = "/" elseif path:sub(1, 1) == "?" then path = "/" .. path end
  if path:find("[%s%c]") then error(("%s: the path has a space or control character; escape it (%%20)"):format(url), 0) end
  local host, port_text
  if authority:sub(1, 1) == "[" then
    host, port_text = authority:match("^%[([%x:%.]+)%](.*)$")
    if not host then error(("%s: '%s' is not an IPv6 address in brackets"):format(url, authority), 0) end
  else
    host, port_text = authority:match("^([^:]*)(.*)$")
  end
  if host == "" then error(("%s: no host; expected http://HOST[:PORT]/PATH"):format(url), 0) end
  if not host:match("^[%w%.%-_:]+$") then
    error(("%s: '%s' is not a host name or address"):format(url, host), 0)
  end
  local port = 80
  if port_text ~= "" then
    local digits = port_text:match("^:(%d+)$")
    if not digits then
      error(("%s: '%s' after the host is not a port; expected :PORT with PORT in 1-65535"):format(url, port_text), 0)
    end
    port = tonumber(digits)
    if #digits > 5 or port < 1 or port > 65535 then
      error(("%s: port %s is out of range (1-65535)"):format(url, digits), 0)
    end
  end
  return host, port, path
end
M.parse_url = parse_url

-- Connects and sends the POST: the connection, or nil, why, kind ("connect" | "timeout").
function M.http_send(url, body, deadline)
  local host, port, path = parse_url(url)
  local conn, why = ipc.connect(host, port, deadline)
  if not conn then
    return nil, ("cannot connect to %s:%d (%s)"):format(host, port, why), why == "connection timed out" and "timeout" or "connect"
  end
  local host_header = host:find(":", 1, true) and ("[" .. host .. "]") or host
  local head = ("POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" ..
    "Accept: application/json\r\nConnection: close\r\nUser-Agent: remax\r\n\r\n"):format(path, host_header, port, #body)
  local ok, werr = conn:write(head .. body, deadline)
  if not ok then
    conn:close()
    return nil, werr, werr == "timeout" and "timeout" or "connect"
  end
  return conn
end

-- Buffered reading of an HTTP response from a connection: lines, exact byte counts, the rest
-- until the peer closes. Each raises {why =, kind =} on a failure. Linear in what it reads.
local Reader = {}
Reader.__index = Reader

local function rfail(why, kind) error({ why = why, kind = kind }, 0) end

function Reader:fill()
  local chunk, why = self.conn:read_some(self.deadline)
  if not chunk then
    if why == "closed" then return false end
    rfail(why, why == "timeout" and "timeout" or "connect")
  end
  self.got = self.got + #chunk
  if self.pos > #self.buf then self.buf = chunk else self.buf = self.buf:sub(self.pos) .. chunk end
  self.pos = 1
  return true
end

-- One header or chunk-size line (without CRLF; a bare LF is taken too); nil at a close before any byte.
function Reader:line()
  while true do
    local e = self.buf:find("\n", self.pos, true)
    if e then
      local l = self.buf:sub(self.pos, e - 1):gsub("\r$", "")
      self.pos = e + 1
      return l
    end
    if #self.buf - self.pos > 65536 then rfail("answered a header line longer than 64 KiB", "answer") end
    if not self:fill() then
      if self.pos > #self.buf and self.got == 0 then return nil end
      rfail("the answer is cut short (the server closed the connection in the headers)", "answer")
    end
  end
end

-- Exactly n bytes.
function Reader:bytes(n)
  local parts, have = {}, 0
  while true do
    local avail = #self.buf - self.pos + 1
    if avail >= n - have then
      parts[#parts + 1] = self.buf:sub(self.pos, self.pos + (n - have) - 1)
      self.pos = self.pos + (n - have)
      return table.concat(parts)
    end
    if avail > 0 then parts[#parts + 1] = self.buf:sub(self.pos) end
    have = have + avail
    self.buf, self.pos = "", 1
    if not self:fill() then rfail(("the answer is cut short (%d of %d bytes)"):format(have, n), "answer") end
  end
end

-- Everything until the peer closes, at most `limit` bytes.
function Reader:rest(limit)
  local parts, have = {}, 0
  while true do
    if self.pos <= #self.buf then
      local part = self.buf:sub(self.pos)
      have = have + #part
      parts[#parts + 1] = part
    end
    self.buf, self.pos = "", 1
    if have > limit then rfail(("answered a body longer than reward_max_line_bytes = %d bytes"):format(limit), "answer") end
    if not self:fill() then return table.concat(parts) end
  end
end

-- Reads the answer on a connection: the body when the status is 2xx, or nil, why, kind
-- ("connect" | "timeout" | "answer"). The body ends at its Content-Length, or at the last
-- chunk of a chunked one, so a server that keeps the connection open is read at once; without
-- either, at the close. limit: the most bytes of a body (reward_max_line_bytes).
function M.http_receive(conn, deadline, limit)
  limit = limit or M.MAX_LINE_BYTES
  local rd = setmetatable({ conn = conn, deadline = deadline, buf = "", pos = 1, got = 0 }, Reader)
  local ok, a, b, c = pcall(function()
    local status_line, code, headers
    repeat
      status_line = rd:line()
      if not status_line then rfail("the server closed the connection without answering", "connect") end
      code = tonumber(status_line:match("^HTTP/%d[%.%d]* (%d%d%d)"))
      if not code then rfail(("answered something that is not HTTP: %s"):format(clip(status_line, 200)), "answer") end
      headers = {}
      while true do
        local l = rd:line()
        if not l then rfail("the answer is cut short (the server closed the connection in the headers)", "answer") end
        if l == "" then break end
        local k, v = l:match("^([^:]+):%s*(.-)%s*$")
        if k then headers[k:lower()] = v end
      end
    until code >= 200 or code == 101   -- 100 Continue and other 1xx: the real answer follows
    local payload
    local te, cl = headers["transfer-encoding"], headers["content-length"]
    if te and te:lower():find("chunked", 1, true) then
      local parts, have = {}, 0
      while true do
        local size_line = rd:line()
        local size = size_line and tonumber(size_line:match("^%s*(%x+)"), 16)
        if not size then rfail("a chunked answer is cut short or malformed", "answer") end
        if size == 0 then
          repeat local t = rd:line() until t == nil or t == ""   -- trailers
          break
        end
        have = have + size
        if have > limit then rfail(("answered a body longer than reward_max_line_bytes = %d bytes"):format(limit), "answer") end
        parts[#parts + 1] = rd:bytes(size)
        rd:bytes(2)   -- the CRLF after the chunk
      end
      payload = table.concat(parts)
    elseif cl then
      local len = tonumber(cl:match("^%d+$"))
      if not len then rfail(("answered Content-Length: %s, which is not a byte count"):format(clip(cl, 40)), "answer") end
      if len > limit then
        rfail(("answered a body of %d bytes, longer than reward_max_line_bytes = %d bytes"):format(len, limit), "answer")
      end
      payload = rd:bytes(len)
    elseif code == 204 or code == 304 then
      payload = ""
    else
      payload = rd:rest(limit)
    end
    if code < 200 or code > 299 then
      rfail(("answered %s: %s"):format(status_line, clip(payload, 300)), "answer")
    end
    if payload:match("^%s*$") then
      rfail(("answered %s with an empty body; expected the JSON {\"id\": N, \"scores\": [number|null, ...]}"):format(status_line), "answer")
    end
    return payload
  end)
  conn:close()
  if ok then return a end
  if type(a) == "table" and a.why then return nil, a.why, a.kind end
  error(a, 0)
end

-- The answer in `data`, the bytes read so far on a connection (closed: whether the peer has
-- closed it): the body, or nil, why, kind as http_receive, or nil, "incomplete" when more bytes
-- are needed. For readers that must not block (tools running while the model decodes).
function M.parse_response(data, closed, limit)
  local given = false
  local fake = { read_some = function()
    if not given then given = true; if #data > 0 then return data end end
    if closed then return nil, "closed" end
    return nil, "incomplete"
  end, close = function() end }
  local payload, why, kind = M.http_receive(fake, nil, limit)
  if payload then return payload end
  if why == "incomplete" then return nil, "incomplete" end
  return nil, why, kind
end

function M.http_post(url, body, deadline, limit)
  local conn, why, kind = M.http_send(url, body, deadline)
  if not conn then return nil, why, kind end
  return M.http_receive(conn, deadline, limit)
end

return M
