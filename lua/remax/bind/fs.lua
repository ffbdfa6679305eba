-- remax.bind.fs: the file operations runs, the trainer and the model share: atomic writes (temporary
-- name, fsync, rename, fsync of the folder), folders, listing, removal. libc through the FFI,
-- since LuaFileSystem is not a dependency; the directory-entry layout is Linux's.
local ffi = require("ffi")

local M = {}

for _, decl in ipairs({
  "int mkdir(const char *path, uint32_t mode);",
  "int rmdir(const char *path);",
  "int unlink(const char *path);",
  "int open(const char *path, int flags, ...);",
  "int close(int fd);",
  "int fsync(int fd);",
  "char *strerror(int errnum);",
  "void *opendir(const char *name);",
  "int closedir(void *dirp);",
  "void *readdir(void *dirp);",
  "struct rx_runs_dirent { uint64_t d_ino; int64_t d_off; unsigned short d_reclen; unsigned char d_type; char d_name[256]; };",
  "int isatty(int fd);",
  "struct rx_fs_winsize { unsigned short ws_row, ws_col, ws_xpixel, ws_ypixel; };",
  "int ioctl(int fd, unsigned long request, ...);",
  "char *getcwd(char *buf, size_t size);",
  "int stat(const char *path, void *buf);",
  "int __xstat(int ver, const char *path, void *buf);",
  "int64_t write(int fd, const void *buf, size_t n);",
  "int getpid(void);",
  "int64_t readlink(const char *path, char *buf, size_t size);",
  "char *realpath(const char *path, char *resolved);",
}) do pcall(ffi.cdef, decl) end
local C = ffi.C

local function is_dir(path)
  local d = C.opendir(path)
  if d == nil then return false end
  C.closedir(d)
  return true
end

local function file_exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

-- Entry names of a folder (no "." or ".."), sorted; {} when it cannot be read.
local function list_dir(path)
  local d = C.opendir(path)
  if d == nil then return {} end
  local out = {}
  while true do
    local e = C.readdir(d)
    if e == nil then break end
    local name = ffi.string(ffi.cast("struct rx_runs_dirent *", e).d_name)
    if name ~= "." and name ~= ".." then out[#out + 1] = name end
  end
  C.closedir(d)
  table.sort(out)
  return out
end

local function mkdir_p(path)
  local prefix = path:sub(1, 1) == "/" and "/" or ""
  for part in path:gmatch("[^/]+") do
    prefix = prefix .. part
    if not is_dir(prefix) and C.mkdir(prefix, tonumber("755", 8)) ~= 0 then
      local code = ffi.errno()   -- read before is_dir below sets it again
      if not is_dir(prefix) then
        error(("cannot create folder %s (errno %d, %s)"):format(prefix, code, ffi.string(C.strerror(code))), 3)
      end
    end
    prefix = prefix .. "/"
  end
end

-- Removes a file or a folder tree. unlink first: it never follows a symbolic link, so a link to
-- a folder is removed, not the folder it points to.
local function remove_tree(path)
  if C.unlink(path) == 0 then return end
  if not is_dir(path) then return end
  for _, name in ipairs(list_dir(path)) do remove_tree(path .. "/" .. name) end
  if C.rmdir(path) ~= 0 then error(("cannot remove %s (errno %d)"):format(path, ffi.errno()), 2) end
end

-- The crash-safety test's hook (rx_crash_point in remax.h): with REMAX_CRASH_AT or
-- REMAX_CRASH_LIST set, each write event is counted and the chosen one is killed by SIGKILL.
local crash_test = os.getenv("REMAX_CRASH_AT") or os.getenv("REMAX_CRASH_LIST")
local function crash_point(event)
  if crash_test then require("remax.bind.ffi").C.rx_crash_point(event) end
end

local function errno_text(code)
  return ("errno %d, %s"):format(code, ffi.string(C.strerror(code)))
end

-- fsync of a file or a folder; a failure is an error naming the path and the errno (EINVAL and
-- EROFS excepted for folders: file systems that cannot sync a folder say so).
local function fsync_path(path)
  local fd = C.open(path, 0)   -- O_RDONLY: enough to fsync a file or a folder on Linux
  if fd < 0 then error(("cannot open %s to fsync it (%s)"):format(path, errno_text(ffi.errno())), 2) end
  local rc, code = C.fsync(fd), ffi.errno()
  C.close(fd)
  if rc ~= 0 and not ((code == 22 or code == 30) and is_dir(path)) then
    error(("fsync of %s failed (%s)"):format(path, errno_text(code)), 2)
  end
end

local function dirname(path) return path:match("^(.*)/[^/]*$") or "." end

-- Writes text to path through path.tmp, fsync and rename. A failure (a full disk, a read-only
-- folder) is an error naming the file and the errno, and leaves path as it was.
local function write_atomic(path, text)
  M.check_output(path)
  local tmp = path .. ".tmp"
  local f, err, code = io.open(tmp, "wb")
  if not f then error(("cannot write %s (%s; errno %s)"):format(tmp, tostring(err), tostring(code)), 2) end
  local half = crash_test and math.floor(#text / 2) or #text
  local ok, werr, wcode = f:write(text:sub(1, half))
  if ok then ok, werr, wcode = f:flush() end
  if ok and half < #text then
    crash_point("write_atomic: half written: " .. path)
    ok, werr, wcode = f:write(text:sub(half + 1))
    if ok then ok, werr, wcode = f:flush() end
  end
  local cok, cerr, ccode = f:close()
  if ok and not cok then ok, werr, wcode = cok, cerr, ccode end
  if not ok then
    os.remove(tmp)
    error(("cannot write %s (%s; errno %s)"):format(tmp, tostring(werr), tostring(wcode)), 2)
  end
  local sok, serr = pcall(fsync_path, tmp)
  if not sok then os.remove(tmp) error(serr, 2) end
  crash_point("write_atomic: before rename: " .. path)
  local rok, rerr, rcode = os.rename(tmp, path)
  if not rok then
    os.remove(tmp)
    error(("cannot rename %s to %s (%s; errno %s)"):format(tmp, path, tostring(rerr), tostring(rcode)), 2)
  end
  crash_point("write_atomic: after rename: " .. path)
  fsync_path(dirname(path))
end

-- A large file written piece by piece and installed whole (the GGUF export): the bytes go to
-- path.tmp.<pid> (mode 0644 less the umask); sync() fsyncs it, close() closes it, install()
-- renames it over path and fsyncs the folder, remove() deletes it (path stays as it was).
-- Errors name the file and the errno.
local Atomic = {}
Atomic.__index = Atomic

function M.open_atomic(path)
  local tmp = ("%s.tmp.%d"):format(path, C.getpid())
  -- O_WRONLY | O_CREAT | O_TRUNC; the mode goes through the varargs as an int (a Lua number would be a double)
  local fd = C.open(tmp, 0x241, ffi.new("int", 420))
  if fd < 0 then error(("cannot create %s (%s)"):format(tmp, errno_text(ffi.errno())), 0) end
  return setmetatable({ fd = fd, tmp = tmp, path = path }, Atomic)
end

-- Writes n bytes at ptr (a pointer or a string) to the file, or raises naming it and the errno.
function Atomic:write(ptr, n)
  local p = ffi.cast("const uint8_t *", ptr)
  local done = 0
  while done < n do
    local chunk = math.min(n - done, 2 ^ 30)
    local w = tonumber(C.write(self.fd, p + done, chunk))
    if w < 0 then
      local code = ffi.errno()
      if code ~= 4 then error(("cannot write %s (%s)"):format(self.tmp, errno_text(code)), 0) end   -- 4: EINTR
    else
      done = done + w
    end
  end
end

function Atomic:sync()
  if C.fsync(self.fd) ~= 0 then error(("fsync of %s failed (%s)"):format(self.tmp, errno_text(ffi.errno())), 0) end
end

function Atomic:close() C.close(self.fd) end
function Atomic:remove() C.unlink(self.tmp) end

function Atomic:install()
  local rok, rerr, rcode = os.rename(self.tmp, self.path)
  if not rok then
    C.unlink(self.tmp)
    error(("cannot rename %s to %s (%s; errno %s)"):format(self.tmp, self.path, tostring(rerr), tostring(rcode)), 0)
  end
  fsync_path(dirname(self.path))
end

-- The target of a symbolic link, or nil when path is not one.
function M.link_target(path)
  local buf = ffi.new("char[4096]")
  local n = tonumber(C.readlink(path, buf, 4095))
  return n > 0 and ffi.string(buf, n) or nil
end

local function read_text(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

-- The whole of a text file a user named (a dataset, a config), or an error naming it: a folder,
-- a file that cannot be opened, a binary file or a device (a NUL byte: text formats have none,
-- and /dev/zero would otherwise fill the memory), or one over `limit` bytes (default 4 GiB).
-- `what` says what the file is for ("--data", "config.json").
M.TEXT_LIMIT = 2 ^ 32
local function read_text_file(path, what, limit)
  local label = what and (what .. " " .. path) or path
  if type(path) ~= "string" or path == "" then error(("%s: expected a file path"):format(what or "file"), 0) end
  if is_dir(path) then error(("%s is a folder, expected a file"):format(label), 0) end
  local f, err = io.open(path, "rb")
  if not f then error(("cannot open %s: %s"):format(label, (tostring(err):gsub("^.*: ", ""))), 0) end
  limit = limit or M.TEXT_LIMIT
  local parts, total = {}, 0
  while true do
    local ok, chunk = pcall(f.read, f, 2 ^ 20)
    if not ok then
      f:close()
      error(("cannot read %s (%s)"):format(label, tostring(chunk)), 0)
    end
    if not chunk then break end
    local nul = chunk:find("\0", 1, true)
    if nul then
      f:close()
      error(("%s is not a text file: byte %d is NUL (a binary file, or a device such as /dev/zero?)"):format(
        label, total + nul), 0)
    end
    total = total + #chunk
    if total > limit then
      f:close()
      error(("%s is over %d MiB; remax reads it whole (split it, or is it a device or a pipe?)"):format(
        label, limit / 2 ^ 20), 0)
    end
    parts[#parts + 1] = chunk
  end
  f:close()
  local ok, text = pcall(table.concat, parts)
  if not ok then error(("%s (%d bytes) does not fit in memory: %s"):format(label, total, tostring(text)), 0) end
  return text
end
M.read_text_file = read_text_file

---------------------------------------------------------------------------- output paths

-- What a path names, following links: "missing", "file", "folder", "character device", "block
-- device", "fifo", "socket" (nil when stat fails otherwise). struct stat's st_mode sits at byte
-- 24 on x86_64 and at 16 on aarch64 (the generic layout).
local MODE_OFFSET = ffi.arch == "x64" and 24 or 16
local KINDS = { [0x8000] = "file", [0x4000] = "folder", [0x2000] = "character device", [0x6000] = "block device",
  [0x1000] = "fifo", [0xC000] = "socket", [0xA000] = "link" }
local function file_kind(path)
  local buf = ffi.new("uint8_t[512]")
  local ok, rc = pcall(function() return C.stat(path, buf) end)
  if not ok then   -- a glibc before 2.33: stat is __xstat
    ok, rc = pcall(function() return C.__xstat(ffi.arch == "x64" and 1 or 0, path, buf) end)
  end
  if not ok then return nil end
  if rc ~= 0 then return ffi.errno() == 2 and "missing" or nil end
  local mode = ffi.cast("uint32_t *", buf + MODE_OFFSET)[0]
  return KINDS[bit.band(mode, 0xF000)] or "special file"
end
M.file_kind = file_kind

-- Refuses an output path that names anything but a regular file (or nothing yet): writing to a
-- temporary name and renaming it over a device node, a fifo or a socket would replace it, and a
-- folder is not a file. `what` names the path's role ("export --gguf"). With opts.parent, a
-- path whose folder does not exist is refused too. Returns the path.
function M.check_output(path, what, opts)
  local label = what and (what .. " " .. tostring(path)) or tostring(path)
  if type(path) ~= "string" or path == "" then error(("%s: expected a file path"):format(what or "output"), 0) end
  local kind = file_kind(path)
  if kind and kind ~= "file" and kind ~= "missing" then
    error(("%s is a %s, not a regular file; remax writes only to a file path (it would replace the %s with a file); give the path of a file"):format(
      label, kind, kind), 0)
  end
  if not (opts and opts.parent) then return path end
  local parent = dirname(path)
  local pkind = file_kind(parent)
  if pkind == "missing" then error(("%s: folder %s does not exist"):format(label, parent), 0) end
  if pkind and pkind ~= "folder" then error(("%s: %s is a %s, not a folder"):format(label, parent, pkind), 0) end
  return path
end

M.is_dir, M.list_dir, M.mkdir_p, M.remove_tree = is_dir, list_dir, mkdir_p, remove_tree
M.write_atomic, M.read_text, M.exists, M.fsync_path, M.dirname = write_atomic, read_text, file_exists, fsync_path, dirname
M.crash_point, M.errno_text = crash_point, errno_text

-- The current folder (nil when it cannot be read: removed under us).
function M.cwd()
  local buf = ffi.new("char[?]", 4096)
  if C.getcwd(buf, 4096) == nil then return nil end
  return ffi.string(buf)
end

-- path made absolute against the current folder (or `base`), "./" and "x/.." parts removed; an
-- absolute path is only tidied.
function M.absolute(path, base)
  if type(path) ~= "string" or path == "" then return path end
  if path:sub(1, 1) ~= "/" then
    base = base or M.cwd()
    if not base then return path end
    path = base .. "/" .. path
  end
  local parts = {}
  for part in path:gmatch("[^/]+") do
    if part == ".." then
      if #parts > 0 then parts[#parts] = nil end
    elseif part ~= "." then
      parts[#parts + 1] = part
    end
  end
  return "/" .. table.concat(parts, "/")
end

-- path with its symbolic links, "." and ".." resolved as far as it exists (realpath(3) of its
-- deepest existing part, the rest appended): two spellings of one place give one string.
function M.real_path(path)
  local head, tail = M.absolute(path), nil
  local buf = ffi.new("char[4096]")
  while true do
    if C.realpath(head, buf) ~= nil then
      local r = ffi.string(buf)
      if not tail then return r end
      return (r == "/" and "" or r) .. "/" .. tail
    end
    local parent, name = head:match("^(.*)/([^/]+)$")
    if not parent then return M.absolute(path) end
    tail = tail and name .. "/" .. tail or name
    head = parent == "" and "/" or parent
  end
end

-- Whether fd is a terminal (TERM=dumb counts as none), and its width in columns ( first;
-- 100 when unknown): the progress line draws itself in place only on a terminal.
function M.is_tty(fd)
  if os.getenv("TERM") == "dumb" then return false end
  local ok, r = pcall(function() return C.isatty(fd) end)
  return ok and r == 1
end

function M.columns(fd)
  local env = tonumber(os.getenv("COLUMNS") or "")
  if env and env > 0 then return env end
  if ffi.os == "Linux" then
    local ws = ffi.new("struct rx_fs_winsize")
    local ok, r = pcall(function() return C.ioctl(fd, 0x5413, ws) end)   -- TIOCGWINSZ
    if ok and r == 0 and ws.ws_col > 0 then return ws.ws_col end
  end
  return 100
end

return M
