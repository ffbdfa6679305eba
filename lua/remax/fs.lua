-- remax.fs: the file operations runs, the trainer and the model share: atomic writes (temporary
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
  "void *opendir(const char *name);",
  "int closedir(void *dirp);",
  "void *readdir(void *dirp);",
  "struct rx_runs_dirent { uint64_t d_ino; int64_t d_off; unsigned short d_reclen; unsigned char d_type; char d_name[256]; };",
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
    if not is_dir(prefix) and C.mkdir(prefix, tonumber("755", 8)) ~= 0 and not is_dir(prefix) then
      error(("cannot create folder %s (%s)"):format(prefix, ffi.errno()), 3)
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

local function fsync_path(path)
  local fd = C.open(path, 0)   -- O_RDONLY: enough to fsync a file or a folder on Linux
  if fd >= 0 then
    C.fsync(fd)
    C.close(fd)
  end
end

local function dirname(path) return path:match("^(.*)/[^/]*$") or "." end

-- Writes text to path through path.tmp, fsync and rename.
local function write_atomic(path, text)
  local tmp = path .. ".tmp"
  local f, err = io.open(tmp, "wb")
  if not f then error(("cannot write %s (%s)"):format(tmp, tostring(err)), 2) end
  local ok, werr = f:write(text)
  if ok then ok, werr = f:flush() end
  f:close()
  if not ok then
    os.remove(tmp)
    error(("cannot write %s (%s)"):format(tmp, tostring(werr)), 2)
  end
  fsync_path(tmp)
  local rok, rerr = os.rename(tmp, path)
  if not rok then error(("cannot rename %s to %s (%s)"):format(tmp, path, tostring(rerr)), 2) end
  fsync_path(dirname(path))
end

local function read_text(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

M.is_dir, M.list_dir, M.mkdir_p, M.remove_tree = is_dir, list_dir, mkdir_p, remove_tree
M.write_atomic, M.read_text, M.exists, M.fsync_path, M.dirname = write_atomic, read_text, file_exists, fsync_path, dirname

return M
