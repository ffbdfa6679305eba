-- remax.bind.ipc: child processes joined by pipes to their stdin and stdout, and TCP client
-- connections, each with deadlines: what the channels to other programs (remax.step.channels:
-- rewards, tools and environments outside Lua) talk through. libc through the FFI (Linux
-- x86_64/aarch64 layouts), as remax.bind.fs does.
--
--   local p = ipc.spawn({ "python3", "-u", "worker.py" })       -- stdin/stdout piped, stderr inherited
--   p:write("line\n", ipc.now() + 5)                             -- true, or nil, "timeout"|"closed"
--   local line, why = p:read_line(ipc.now() + 5, limit)          -- why: "timeout"|"closed"|"too long"
--   p:close()                                                     -- EOF to its stdin, reaped (killed after 1 s)
--   local c = ipc.connect("127.0.0.1", 8000, deadline); c:write(...); c:read_all(deadline); c:close()
--
-- Children start in their own process group, so a Ctrl-C at the terminal reaches the trainer only
-- (which saves and stops, closing the workers) and not a worker in the middle of a batch, and with
-- SIGPIPE at its default even though this process ignores it (a write to a worker that died must
-- be an error to report, not a signal that kills the run). Each child's process group is
-- registered with the engine (rx_child_add), which kills it when this process ends in any way
-- but SIGKILL: at exit, on a second Ctrl-C, on a signal before the trainer catches signals.
-- Closing a child kills what is left of its group too (a shell's background children).
local ffi = require("ffi")

local M = {}

for _, decl in ipairs({
  "int pipe2(int fds[2], int flags);",
  "int close(int fd);",
  "int64_t read(int fd, void *buf, size_t n);",
  "int64_t write(int fd, const void *buf, size_t n);",
  "struct rx_ipc_pollfd { int fd; short events; short revents; };",
  "int poll(struct rx_ipc_pollfd *fds, unsigned long nfds, int timeout);",
  "int fcntl(int fd, int cmd, ...);",
  "int posix_spawnp(int *pid, const char *file, const void *file_actions, const void *attrp, char *const argv[], char *const envp[]);",
  "int posix_spawn_file_actions_init(void *fa);",
  "int posix_spawn_file_actions_destroy(void *fa);",
  "int posix_spawn_file_actions_adddup2(void *fa, int fd, int newfd);",
  "int posix_spawnattr_init(void *attr);",
  "int posix_spawnattr_destroy(void *attr);",
  "int posix_spawnattr_setflags(void *attr, short flags);",
  "int posix_spawnattr_setpgroup(void *attr, int pgroup);",
  "int posix_spawnattr_setsigdefault(void *attr, const void *sigset);",
  "int sigemptyset(void *set);",
  "int sigaddset(void *set, int signum);",
  "void *signal(int signum, void *handler);",
  "extern char **environ;",
  "int kill(int pid, int sig);",
  "int waitpid(int pid, int *status, int options);",
  "int waitid(int idtype, int id, void *infop, int options);",
  "char *strerror(int errnum);",
  "int getpid(void);",
  "int socket(int domain, int type, int protocol);",
  "int connect(int fd, const void *addr, uint32_t len);",
  "int getsockopt(int fd, int level, int name, void *value, uint32_t *len);",
  "int64_t send(int fd, const void *buf, size_t n, int flags);",
  "struct rx_ipc_addrinfo { int ai_flags; int ai_family; int ai_socktype; int ai_protocol; uint32_t ai_addrlen; void *ai_addr; char *ai_canonname; struct rx_ipc_addrinfo *ai_next; };",
  "int getaddrinfo(const char *node, const char *service, const struct rx_ipc_addrinfo *hints, struct rx_ipc_addrinfo **res);",
  "void freeaddrinfo(struct rx_ipc_addrinfo *res);",
  "const char *gai_strerror(int code);",
}) do pcall(ffi.cdef, decl) end
local C = ffi.C

local O_CLOEXEC, O_NONBLOCK, F_SETFL, F_GETFL = 0x80000, 0x800, 4, 3
local POLLIN, POLLOUT = 1, 4
local EINTR, EAGAIN, EINPROGRESS = 4, 11, 115
local SIGKILL, SIGPIPE, WNOHANG = 9, 13, 1
local P_PID, WEXITED, WNOWAIT = 1, 4, 0x01000000
local POSIX_SPAWN_SETPGROUP, POSIX_SPAWN_SETSIGDEF = 2, 4
local AF_UNSPEC, SOCK_STREAM, SOCK_CLOEXEC, SOCK_NONBLOCK = 0, 1, 0x80000, 0x800
local SOL_SOCKET, SO_ERROR, MSG_NOSIGNAL = 1, 4, 0x4000

M.now = require("remax.bind.clock").now

function M.pid() return C.getpid() end

function M.sleep(seconds) C.poll(nil, 0, math.max(0, math.floor(seconds * 1000 + 0.5))) end

local function errtext(code) return ffi.string(C.strerror(code)) end

local sigpipe_ignored = false
local function ignore_sigpipe()
  if not sigpipe_ignored then
    C.signal(SIGPIPE, ffi.cast("void *", 1))   -- SIG_IGN
    sigpipe_ignored = true
  end
end

-- Milliseconds left before a deadline (nil: wait without end), for poll.
local function ms_left(deadline)
  if not deadline then return -1 end
  return math.max(0, math.floor((deadline - M.now()) * 1000 + 0.5))
end

-- Waits until fd is ready for `events`; true, or nil, "timeout".
local function wait_fd(fd, events, deadline)
  local p = ffi.new("struct rx_ipc_pollfd[1]")
  p[0].fd, p[0].events = fd, events
  while true do
    local r = C.poll(p, 1, ms_left(deadline))
    if r > 0 then return true end
    if r == 0 then return nil, "timeout" end
    local e = ffi.errno()
    if e ~= EINTR then return nil, "poll: " .. errtext(e) end
  end
end

local function set_nonblocking(fd)
  C.fcntl(fd, F_SETFL, ffi.cast("int", bit.bor(C.fcntl(fd, F_GETFL), O_NONBLOCK)))
end

-- Writes all of `data` to a non-blocking fd; true, or nil, "timeout" | "closed" | message.
local function write_all(fd, data, deadline, send)
  local buf, n, done = ffi.cast("const char *", data), #data, 0
  while done < n do
    local w = send and C.send(fd, buf + done, n - done, MSG_NOSIGNAL) or C.write(fd, buf + done, n - done)
    w = tonumber(w)
    if w > 0 then
      done = done + w
    else
      local e = ffi.errno()
      if e == EAGAIN then
        local ok, why = wait_fd(fd, POLLOUT, deadline)
        if not ok then return nil, why end
      elseif e ~= EINTR then
        return nil, (e == 32 or e == 104) and "closed" or errtext(e)   -- EPIPE, ECONNRESET
      end
    end
  end
  return true
end

-- Reads what is there (at least one byte, waiting until the deadline): the bytes, or nil, why.
local function read_some(fd, deadline, buf, size)
  while true do
    local ok, why = wait_fd(fd, POLLIN, deadline)
    if not ok then return nil, why end
    local r = tonumber(C.read(fd, buf, size))
    if r > 0 then return ffi.string(buf, r) end
    if r == 0 then return nil, "closed" end
    local e = ffi.errno()
    if e == 104 then return nil, "closed" end
    if e ~= EINTR and e ~= EAGAIN then return nil, errtext(e) end
  end
end

local READ_SIZE = 65536

---------------------------------------------------------------------------------------------
-- Child processes.

local Proc = {}
Proc.__index = Proc

-- libremax (for rx_child_add/remove), or nil where it is not there (ipc is usable without it).
local engine_C
local function engine_lib()
  if engine_C == nil then
    local ok, lib = pcall(function()
      local C_ = require("remax.bind.ffi").C
      local _ = C_.rx_child_add
      return C_
    end)
    engine_C = ok and lib or false
  end
  return engine_C or nil
end

-- Starts argv[1] (looked up in PATH) with argv; its stdin and stdout are pipes to us, its stderr
-- is ours. Returns the process, or raises an error naming the program.
function M.spawn(argv)
  ignore_sigpipe()
  local to_child, from_child = ffi.new("int[2]"), ffi.new("int[2]")
  if C.pipe2(to_child, O_CLOEXEC) ~= 0 or C.pipe2(from_child, O_CLOEXEC) ~= 0 then
    error(("cannot start %s: pipe: %s"):format(argv[1], errtext(ffi.errno())), 0)
  end
  local fa = ffi.new("uint8_t[256]")      -- posix_spawn_file_actions_t (80 bytes on glibc)
  local attr = ffi.new("uint8_t[512]")    -- posix_spawnattr_t (336 bytes on glibc)
  local sigs = ffi.new("uint8_t[128]")    -- sigset_t
  C.posix_spawn_file_actions_init(fa)
  C.posix_spawn_file_actions_adddup2(fa, to_child[0], 0)
  C.posix_spawn_file_actions_adddup2(fa, from_child[1], 1)
  C.posix_spawnattr_init(attr)
  C.sigemptyset(sigs)
  C.sigaddset(sigs, SIGPIPE)
  C.posix_spawnattr_setsigdefault(attr, sigs)
  C.posix_spawnattr_setpgroup(attr, 0)
  C.posix_spawnattr_setflags(attr, bit.bor(POSIX_SPAWN_SETPGROUP, POSIX_SPAWN_SETSIGDEF))
  local cargs = ffi.new("char *[?]", #argv + 1)
  local keep = {}
  for i, a in ipairs(argv) do
    keep[i] = ffi.new("char[?]", #a + 1, a)
    cargs[i - 1] = keep[i]
  end
  cargs[#argv] = nil
  local pid = ffi.new("int[1]")
  local rc = C.posix_spawnp(pid, argv[1], fa, attr, cargs, C.environ)
  C.posix_spawn_file_actions_destroy(fa)
  C.posix_spawnattr_destroy(attr)
  C.close(to_child[0])
  C.close(from_child[1])
  if rc ~= 0 then
    C.close(to_child[1])
    C.close(from_child[0])
    error(("cannot start %s: %s"):format(argv[1], errtext(rc)), 0)
  end
  set_nonblocking(to_child[1])
  set_nonblocking(from_child[0])
  local p = setmetatable({ pid = pid[0], stdin = to_child[1], stdout = from_child[0], pending = "", pos = 1,
    buf = ffi.new("char[?]", READ_SIZE), argv = argv }, Proc)
  local engine = engine_lib()
  if engine then engine.rx_child_add(p.pid) end
  return p
end

function Proc:write(data, deadline)
  if not self.stdin then return nil, "closed" end
  return write_all(self.stdin, data, deadline)
end

-- Writes what the pipe takes now of `data` from byte `from` (default 1) on, without waiting:
-- the number of bytes written (0 when the pipe is full), or nil, "closed" | message.
function Proc:write_now(data, from)
  if not self.stdin then return nil, "closed" end
  from = from or 1
  local n = #data - from + 1
  if n <= 0 then return 0 end
  local buf = ffi.cast("const char *", data) + (from - 1)
  while true do
    local w = tonumber(C.write(self.stdin, buf, n))
    if w >= 0 then return w end
    local e = ffi.errno()
    if e == EAGAIN then return 0 end
    if e ~= EINTR then return nil, e == 32 and "closed" or errtext(e) end   -- EPIPE: the reader is gone
  end
end

-- The next line of the child's stdout, without its newline; or nil, "timeout" | "closed" |
-- "too long" (more than `limit` bytes without a newline; nil: no limit). Linear in the line's
-- length: the parts are kept in a list and joined once, and only new bytes are searched.
function Proc:read_line(deadline, limit)
  local parts, size = nil, 0
  while true do
    local pending, pos = self.pending, self.pos
    local nl = pending:find("\n", pos, true)
    local stop = nl and nl - 1 or #pending
    size = size + (stop - pos + 1)
    if limit and size > limit then
      self.pending, self.pos = "", 1
      return nil, "too long"
    end
    if nl then
      local head = pending:sub(pos, nl - 1)
      self.pos = nl + 1
      if not parts then return head end
      parts[#parts + 1] = head
      return table.concat(parts)
    end
    if stop >= pos then
      parts = parts or {}
      parts[#parts + 1] = pos == 1 and pending or pending:sub(pos)
    end
    self.pending, self.pos = "", 1
    if not self.stdout then return nil, "closed" end
    local chunk, why = read_some(self.stdout, deadline, self.buf, READ_SIZE)
    if not chunk then
      -- what came of the line so far stays for the next call
      self.pending = parts and table.concat(parts) or ""
      return nil, why
    end
    self.pending = chunk
  end
end

-- Whether the child still runs; when it has ended, false and a description of how. An ended
-- child is reaped only after what is left of its process group is killed (its pid, and so the
-- group's id, cannot be reused before).
function Proc:running()
  if self.exit then return false, self.exit end
  local info = ffi.new("int[32]")   -- siginfo_t: si_pid at byte 16
  local r
  repeat r = C.waitid(P_PID, self.pid, info, bit.bor(WEXITED, WNOHANG, WNOWAIT))
  until r == 0 or ffi.errno() ~= EINTR
  if r == 0 and info[4] == 0 then return true end
  local engine = engine_lib()
  if r ~= 0 then   -- not our child any more (reaped elsewhere): nothing to kill or reap
    if engine then engine.rx_child_remove(self.pid) end
    self.exit = "ended"
    return false, self.exit
  end
  C.kill(-self.pid, SIGKILL)   -- the rest of its group: a shell's background children
  local status = ffi.new("int[1]")
  C.waitpid(self.pid, status, 0)
  if engine then engine.rx_child_remove(self.pid) end
  local s = status[0]
  if bit.band(s, 0x7f) == 0 then
    self.exit = ("exit status %d"):format(bit.rshift(bit.band(s, 0xff00), 8))
  else
    self.exit = ("killed by signal %d"):format(bit.band(s, 0x7f))
  end
  return false, self.exit
end

-- Waits up to `grace` seconds (default 1) for the child to end; false when it still runs.
function Proc:wait(grace)
  local deadline = M.now() + (grace or 1)
  while true do
    local running = self:running()
    if not running then return true end
    if M.now() >= deadline then return false end
    C.poll(nil, 0, 10)
  end
end

function Proc:kill()
  -- the whole process group: a shell's children too
  if self:running() then C.kill(-self.pid, SIGKILL) end
  self:wait(5)
end

-- Closes the child's stdin (a worker's signal to finish), waits `grace` seconds, then kills it;
-- what is left of its process group is killed either way.
function Proc:close(grace)
  if self.stdin then C.close(self.stdin); self.stdin = nil end
  if not self:wait(grace or 1) then self:kill() end
  if self.stdout then C.close(self.stdout); self.stdout = nil end
end

-- Waits until one of `readers` (processes: their stdout; connections) has something to read, or
-- one of `writers` (processes) can take more on its stdin, or the deadline passes: true, or nil,
-- "timeout". Bytes a process's read_line keeps from an earlier read are not seen here: read
-- them first.
function M.wait_ready(readers, writers, deadline)
  writers = writers or {}
  local n = 0
  local p = ffi.new("struct rx_ipc_pollfd[?]", math.max(1, #readers + #writers))
  for _, o in ipairs(readers) do
    local fd = o.stdout or o.fd
    if fd then p[n].fd, p[n].events = fd, POLLIN; n = n + 1 end
  end
  for _, o in ipairs(writers) do
    if o.stdin then p[n].fd, p[n].events = o.stdin, POLLOUT; n = n + 1 end
  end
  if n == 0 then
    M.sleep(math.max(0, (deadline or M.now()) - M.now()))
    return nil, "timeout"
  end
  while true do
    local r = C.poll(p, n, ms_left(deadline))
    if r > 0 then return true end
    if r == 0 then return nil, "timeout" end
    local e = ffi.errno()
    if e ~= EINTR then return nil, "poll: " .. errtext(e) end
  end
end

---------------------------------------------------------------------------------------------
-- TCP client connections.

local Conn = {}
Conn.__index = Conn

-- Connects to host:port before the deadline; the connection, or nil and why.
function M.connect(host, port, deadline)
  ignore_sigpipe()
  local hints = ffi.new("struct rx_ipc_addrinfo")
  hints.ai_family, hints.ai_socktype = AF_UNSPEC, SOCK_STREAM
  local res = ffi.new("struct rx_ipc_addrinfo *[1]")
  local rc = C.getaddrinfo(host, tostring(port), hints, res)
  if rc ~= 0 then return nil, ("cannot resolve %s: %s"):format(host, ffi.string(C.gai_strerror(rc))) end
  local why = "no address"
  local ai = res[0]
  while ai ~= nil do
    local fd = C.socket(ai.ai_family, bit.bor(SOCK_STREAM, SOCK_CLOEXEC, SOCK_NONBLOCK), 0)
    if fd >= 0 then
      local r = C.connect(fd, ai.ai_addr, ai.ai_addrlen)
      local e = r == 0 and 0 or ffi.errno()
      if e == EINPROGRESS then
        local ok, w = wait_fd(fd, POLLOUT, deadline)
        if ok then
          local err, len = ffi.new("int[1]"), ffi.new("uint32_t[1]", 4)
          C.getsockopt(fd, SOL_SOCKET, SO_ERROR, err, len)
          e = err[0]
          if e ~= 0 then why = errtext(e) end
        else
          e, why = -1, w == "timeout" and "connection timed out" or w
        end
      elseif e ~= 0 then
        why = errtext(e)
      end
      if e == 0 then
        C.freeaddrinfo(res[0])
        return setmetatable({ fd = fd, buf = ffi.new("char[?]", READ_SIZE) }, Conn)
      end
      C.close(fd)
    else
      why = errtext(ffi.errno())
    end
    ai = ai.ai_next
  end
  C.freeaddrinfo(res[0])
  return nil, why
end

function Conn:write(data, deadline)
  if not self.fd then return nil, "closed" end
  return write_all(self.fd, data, deadline, true)
end

-- What the peer has sent (at least one byte, waiting until the deadline); or nil, "timeout" |
-- "closed" | message.
function Conn:read_some(deadline)
  if not self.fd then return nil, "closed" end
  return read_some(self.fd, deadline, self.buf, READ_SIZE)
end

-- Everything the peer sends until it closes the connection; or nil, why, what came so far.
function Conn:read_all(deadline)
  local parts = {}
  while true do
    local chunk, why = read_some(self.fd, deadline, self.buf, READ_SIZE)
    if not chunk then
      if why == "closed" then return table.concat(parts) end
      return nil, why, table.concat(parts)
    end
    parts[#parts + 1] = chunk
  end
end

function Conn:close()
  if self.fd then C.close(self.fd); self.fd = nil end
end

return M
