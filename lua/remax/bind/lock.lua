-- remax.bind.lock: an exclusive lock on a file (flock), held by this process until it exits.
-- The file holds the owner's pid, host and start time, so a refused process can name it. The
-- kernel drops the lock when its holder exits however it ends (kill -9 included), so a lock
-- file whose lock is free was left by a process that has ended: taking it says so.
--
--   local held, other, prev = lock.take(path)
--   held   -- true: this process holds it now (prev: what a process that has ended left, or nil)
--          -- false: another process holds it; other = { pid =, host =, since = } from the file
local ffi = require("ffi")

for _, decl in ipairs({
  "int open(const char *path, int flags, ...);",
  "int close(int fd);",
  "int flock(int fd, int operation);",
  "int ftruncate(int fd, int64_t length);",
  "int64_t pread(int fd, void *buf, size_t n, int64_t offset);",
  "int64_t pwrite(int fd, const void *buf, size_t n, int64_t offset);",
  "int fsync(int fd);",
  "int gethostname(char *name, size_t len);",
  "int getpid(void);",
  "char *strerror(int errnum);",
}) do pcall(ffi.cdef, decl) end
local C = ffi.C

local M = {}

local O_RDWR, O_CREAT, O_CLOEXEC = 2, 64, 524288   -- Linux; CLOEXEC: children (reward programs) never hold it
local LOCK_EX, LOCK_NB, LOCK_UN = 2, 4, 8
local EWOULDBLOCK = 11

local held = {}   -- path -> fd, for the life of the process

function M.host()
  local buf = ffi.new("char[256]")
  if C.gethostname(buf, 255) ~= 0 then return "?" end
  return ffi.string(buf)
end

-- "pid 123 on host h since 2026-12-02 12:40:11 UTC" from the file's text.
local function parse(text)
  if not text or text == "" then return nil end
  local info = {}
  for k, v in text:gmatch("(%w+)=([^\n]*)") do info[k] = v end
  if not info.pid then return nil end
  return info
end

function M.describe(info)
  if not info then return "an unknown process" end
  return ("pid %s on host %s since %s"):format(info.pid, info.host or "?", info.since or "?")
end

local function read_fd(fd)
  local buf = ffi.new("char[1024]")
  local n = tonumber(C.pread(fd, buf, 1023, 0))
  return n > 0 and ffi.string(buf, n) or ""
end

local function errno_text() return ffi.string(C.strerror(ffi.errno())) end

-- Takes the lock on path (made when absent). Returns true, prev (info a process that ended
-- left, or nil); or false, info (the holder); or raises on an error other than "held".
function M.take(path)
  if held[path] then return true, nil end
  local fd = C.open(path, O_RDWR + O_CREAT + O_CLOEXEC, ffi.cast("int", 420))
  if fd < 0 then error(("cannot open the run's lock file %s (%s)"):format(path, errno_text()), 0) end
  if C.flock(fd, LOCK_EX + LOCK_NB) ~= 0 then
    local e = ffi.errno()
    local info = parse(read_fd(fd))
    C.close(fd)
    -- this process holds it already, through another spelling of the path (runs/x, ./runs/x)
    if e == EWOULDBLOCK and info and tonumber(info.pid) == C.getpid() and info.host == M.host() then return true, nil end
    if e == EWOULDBLOCK then return false, info end
    error(("cannot lock %s (%s)"):format(path, ffi.string(C.strerror(e))), 0)
  end
  local prev = parse(read_fd(fd))
  if prev and tonumber(prev.pid) == C.getpid() and prev.host == M.host() then prev = nil end
  local text = ("pid=%d\nhost=%s\nsince=%s\n"):format(C.getpid(), M.host(), os.date("!%Y-%m-%d %H:%M:%S UTC"))
  C.ftruncate(fd, 0)
  C.pwrite(fd, text, #text, 0)
  C.fsync(fd)
  held[path] = fd
  return true, prev
end

-- Lets go of a lock this process holds (the file stays; the next owner overwrites it).
function M.release(path)
  local fd = held[path]
  if not fd then return end
  C.ftruncate(fd, 0)
  C.flock(fd, LOCK_UN)
  C.close(fd)
  held[path] = nil
end

function M.holds(path) return held[path] ~= nil end

return M
