-- remax.formats.hf_cache: Hugging Face model names (`Qwen/Qwen2.5-0.5B-Instruct`) resolved through the
-- Hugging Face cache layout, so a model downloaded once with `hf download` is used by name.
-- See docs/models.md.
--
--   local dir = hf_cache.model_dir("Qwen/Qwen2.5-0.5B-Instruct")   -- a folder, or raises saying where it looked
--   local dir = hf_cache.model_dir("Qwen/Qwen2.5-0.5B-Instruct@v1") -- a branch, tag or commit
--
-- The cache: $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
-- ~/.cache/huggingface/hub. A repository is models--<org>--<name>/ with refs/<revision> (a file
-- holding a commit hash) and snapshots/<commit>/ (the files, usually links into blobs/).
local fs = require("remax.bind.fs")
local link_target = fs.link_target

local M = {}

-- The snapshot's files that are links to nothing (blobs removed, or a download cut short), as
-- "name (-> target)"; a snapshot's files are links into blobs/.
function M.broken_links(dir)
  local out = {}
  for _, name in ipairs(fs.list_dir(dir)) do
    local path = dir .. "/" .. name
    local target = link_target(path)
    if target and not fs.exists(path) and not fs.is_dir(path) then out[#out + 1] = ("%s (-> %s)"):format(name, target) end
  end
  return out
end

-- The cache folders to look in, in order, each once.
function M.cache_dirs()
  local out, seen = {}, {}
  local function add(d)
    if d and d ~= "" and not seen[d] then seen[d] = true; out[#out + 1] = d end
  end
  add(os.getenv("HF_HUB_CACHE"))
  add(os.getenv("HUGGINGFACE_HUB_CACHE"))   -- the older name
  local hf_home = os.getenv("HF_HOME")
  if hf_home and hf_home ~= "" then add(hf_home .. "/hub") end
  local xdg = os.getenv("XDG_CACHE_HOME")
  if xdg and xdg ~= "" then add(xdg .. "/huggingface/hub") end
  local home = os.getenv("HOME")
  if home and home ~= "" then add(home .. "/.cache/huggingface/hub") end
  return out
end

-- "org/name[@revision]" -> org/name, revision (nil when the text is not a repository id).
function M.parse(name)
  if type(name) ~= "string" then return nil end
  local id, rev = name:match("^([^@]+)@([%w%._%-/]+)$")
  id = id or name
  local org, repo = id:match("^([%w][%w%._%-]*)/([%w][%w%._%-]*)$")
  if not org or org == "." or org == ".." or repo == "." or repo == ".." then return nil end
  return org .. "/" .. repo, rev
end

local function has_model(dir)
  return fs.exists(dir .. "/config.json") or fs.exists(dir .. "/adapter_config.json")
end

local function read_ref(path)
  local text = fs.read_text(path)
  return text and text:match("^%s*(%x+)%s*$")
end

-- The snapshot folder of a repository in one cache, or nil and what was found instead.
local function in_cache(cache, id, rev)
  local repo_dir = ("%s/models--%s"):format(cache, id:gsub("/", "--"))
  if not fs.is_dir(repo_dir) then return nil end
  local snapshots = repo_dir .. "/snapshots"
  local commit
  if rev then
    commit = read_ref(repo_dir .. "/refs/" .. rev) or (fs.is_dir(snapshots .. "/" .. rev) and rev)
    if not commit then return nil, ("%s has no revision '%s' (refs/%s or snapshots/%s)"):format(repo_dir, rev, rev, rev) end
  else
    commit = read_ref(repo_dir .. "/refs/main")
    if not commit then
      local all = fs.list_dir(snapshots)
      if #all == 1 then
        commit = all[1]
      elseif #all == 0 then
        return nil, ("%s has no snapshots (an interrupted download?)"):format(repo_dir)
      else
        return nil, ("%s has no refs/main and %d snapshots (%s): name one as %s@<commit>"):format(repo_dir, #all,
          table.concat(all, ", "), id)
      end
    end
  end
  local dir = snapshots .. "/" .. commit
  if not fs.is_dir(dir) then return nil, ("%s points at snapshot %s, which is not there"):format(repo_dir, commit) end
  local broken = M.broken_links(dir)
  if #broken > 0 then
    return nil, ("%s: broken link%s: %s (the blobs they point to are gone: a download cut short, or a cache cleaned "
      .. "by hand; `hf download %s` fetches them again)"):format(dir, #broken > 1 and "s" or "", table.concat(broken, ", "), id), true
  end
  if not has_model(dir) then
    return nil, ("%s has no config.json (a partial download? `hf download %s` completes it)"):format(dir, id)
  end
  return dir
end

-- The folder of a model given by name: the name itself when it is a local model folder, else
-- the snapshot of that repository in the cache. Returns the folder, or nil and a message saying
-- where it looked and the command that downloads it.
function M.find(name)
  if has_model(name) then return name end
  local id, rev = M.parse(name)
  if not id then return nil, ("%s: no model there (no %s/config.json)"):format(name, name) end
  local looked, notes = {}, {}
  for _, cache in ipairs(M.cache_dirs()) do
    local dir, why, found_broken = in_cache(cache, id, rev)
    if dir then return dir end
    if found_broken then return nil, name .. ": " .. why end
    looked[#looked + 1] = ("%s/models--%s"):format(cache, id:gsub("/", "--"))
    if why then notes[#notes + 1] = why end
  end
  local msg = ("%s: not a model folder here, and not in the Hugging Face cache (looked in %s)"):format(name,
    #looked > 0 and table.concat(looked, ", ") or "no cache folder: HOME, HF_HOME and HF_HUB_CACHE are unset")
  if #notes > 0 then msg = msg .. "; " .. table.concat(notes, "; ") end
  return nil, msg .. ("; download it with: hf download %s%s"):format(id, rev and (" --revision " .. rev) or "")
end

-- As find, raising the message.
function M.model_dir(name, what)
  local dir, err = M.find(name)
  if not dir then error((what and (what .. " ") or "") .. err, 0) end
  return dir
end

return M
