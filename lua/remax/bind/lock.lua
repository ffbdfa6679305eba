-- remax.bind.lock: an exclusive lock on a file (flock), held by this process until it exits.
-- The file holds the owner's pid, host and start time, so a refused process can name it. The
-- kernel drops the lock when its holder exits however it ends (kill -9 included), so a lock
-- file whose lock is free was left by a process that has ended: taking it says so.
--
--   local held, other, prev = lock.take(path)
--   held   -- true: this process holds it now (prev: what a process that has ended left, or nil)
--          -- false: another process holds it; other = { pid =, host =, since = } from the file
--
-- Taking the lock rewrites the file, so it must be the run's own file and nothing else (issue
-- 45): it is opened without following a symbolic link (O_NOFOLLOW: a run.lock linked to another
-- file once truncated that file), and a lock path that names anything but a regular file of one
-- name (a folder, a fifo, a device, a file with other hard links) is refused, naming it, before
-- anything is written.
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
  "int fstat(int fd, void *buf);",
  "int __fxstat(int ver, int fd, void *buf);",
  "int64_t readlink(const char *path, char *buf, size_t n);",
}) do pcall(ffi.cdef, decl) end
local C = ffi.C

local M = {}

local O_RDWR, O_CREAT, O_CLOEXEC = 2, 64, 524288   -- Linux; CLOEXEC: children (reward programs) never hold it
local O_NONBLOCK = 2048                            -- a fifo's open never waits for a writer
local O_NOFOLLOW = ffi.arch == "arm64" and 32768 or 131072   -- arm64 has its own value
local LOCK_EX, LOCK_NB, LOCK_UN = 2, 4, 8
local EWOULDBLOCK, ELOOP, EISDIR = 11, 40, 21
-- struct stat (Linux): st_mode at byte 24 and st_nlink (8 bytes) at 16 on x86-64; on the generic
-- layout (aarch64) st_mode at 16 and st_nlink (4 bytes) at 20
local MODE_AT, NLINK_AT, NLINK_T = 24, 16, "uint64_t *"
if ffi.arch ~= "x64" then MODE_AT, NLINK_AT, NLINK_T = 16, 20, "uint32_t *" end
local KINDS = { [0x4000] = "folder", [0x2000] = "character device", [0x6000] = "block device", [0x1000] = "fifo",
  [0xC000] = "socket", [0xA000] = "symbolic link" }

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

-- The mode and link count of an open file: mode, nlink (nil when fstat fails).
local function fstat(fd)
  local buf = ffi.new("uint8_t[256]")
  local ok, rc = pcall(function() return C.fstat(fd, buf) end)
  if not ok then   -- a glibc before 2.33: fstat is __fxstat
    ok, rc = pcall(function() return C.__fxstat(ffi.arch == "x64" and 1 or 0, fd, buf) end)
  end
  if not ok or rc ~= 0 then return nil end
  return ffi.cast("uint32_t *", buf + MODE_AT)[0], tonumber(ffi.cast(NLINK_T, buf + NLINK_AT)[0])
end

local function link_target(path)
  local buf = ffi.new("char[4096]")
  local n = tonumber(C.readlink(path, buf, 4095))
  return n and n > 0 and ffi.string(buf, n) or "?"
end

local function refuse(path, what)
  error(("the run's lock file %s %s; remax writes its lock only into a regular file of its own (it would "
    .. "rewrite what the path leads to): remove %s and start again"):format(path, what, path), 0)
end

-- Opens path as the lock file: created when absent, never through a symbolic link, and only a
-- regular file with no other name. Returns the fd, or raises naming what the path is.
local function open_lock(path)
  local fd = C.open(path, O_RDWR + O_CREAT + O_CLOEXEC + O_NOFOLLOW + O_NONBLOCK, ffi.cast("int", 420))
  if fd < 0 then
    local e = ffi.errno()
    if e == ELOOP then refuse(path, ("is a symbolic link (to %s)"):format(link_target(path))) end
    if e == EISDIR then refuse(path, "is a folder, not a file") end
    error(("cannot open the run's lock file %s (%s)"):format(path, ffi.string(C.strerror(e))), 0)
  end
  local mode, nlink = fstat(fd)
  local kind = mode and bit.band(mode, 0xF000)
  if kind and kind ~= 0x8000 then
    C.close(fd)
    refuse(path, ("is a %s, not a regular file"):format(KINDS[kind] or "special file"))
  end
  if nlink and nlink > 1 then
    C.close(fd)
    refuse(path, ("has %d names (hard links), so its rewrite would change the file under the other %s too"):format(
      nlink, nlink == 2 and "name" or "names"))
  end
  return fd
end

-- Takes the lock on path (made when absent). Returns true, prev (info a process that ended
-- left, or nil); or false, info (the holder); or raises on an error other than "held".
function M.take(path)
  if held[path] then return true, nil end
  local fd = open_lock(path)
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
