-- The Lua library's layers (docs/architecture.md, "Layers that hold"), checked from the source:
-- every require("remax...") in lua/remax/**/*.lua goes down the order below or stays in its own
-- layer, no two folders and no two files require each other in a circle, and only bind/ reaches
-- C through the FFI. CI runs it (.ci/run, "layering: requires go down"); so does
-- tests/lua/layers_spec.lua.
--
--   luajit tests/layers.lua          (from the repository root) prints file:line: problem, one a
--                                    line, and exits 1 when there is any
--
-- What counts as a require: require("x"), require "x", pcall(require, "x"), wherever they are
-- (inside a function too): hiding a require in a function does not hide it from here. A require
-- whose module is not a string literal cannot be read; it fails unless DYNAMIC allows it, with
-- the reason. What counts as C access: the FFI's C namespace, ffi.load, ffi.cdef and ffi.errno
-- (C's own state), an FFI type of the engine ("rx_...") named in ffi.new, cast, sizeof and the
-- like, and require("remax.bind.ffi") (the engine's library handle). LuaJIT's FFI for plain byte
-- buffers (ffi.new("uint8_t[?]", n), ffi.string, ffi.copy) is not C access.
local M = {}

-- The layers, top first. A module may require modules of its own layer or of a layer below.
-- formats/, text/ and tasks/ are one layer: they may require each other, never in a circle.
M.LAYERS = {
  { name = "cli", folders = { "cli" } },
  { name = "face", folders = { "." } },   -- init.lua (require("remax")) and the alias table of old names
  { name = "run", folders = { "run" } },
  { name = "step", folders = { "step" } },
  { name = "settings", folders = { "settings" } },
  { name = "formats/text/tasks", folders = { "formats", "text", "tasks" } },
  { name = "bind", folders = { "bind" } },
}

-- Requires whose module is computed, each allowed for a reason: file -> { [the require as
-- written] = reason }.
M.DYNAMIC = {
  ["lua/remax/init.lua"] = {
    ["require(name)"] = "the face loads its public modules on first use (M.modules names them; the face is above every layer it names)",
    ['pcall(require, "remax.tasks." .. tostring(k))'] = "remax.tasks.<name>: a task module on first use (tasks/ is below the face)",
  },
  ["lua/remax/step/algos.lua"] = {
    ["require(module)"] = "the algorithm and loss type records, one file each in step/algos/ and step/loss_types/ (below it, in its layer): every file there is one",
  },
  ["lua/remax/deprecated.lua"] = {
    ["require(new)"] = "an old module name loads its new module (the alias table; tests/lua/aliases_spec.lua checks every target)",
  },
}

local FFI_C = { C = true, load = true, cdef = true, errno = true }
local FFI_TYPED = { new = true, cast = true, typeof = true, sizeof = true, istype = true, offsetof = true,
  alignof = true, metatype = true }

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- Lua source -> tokens {kind = "name" | "string" | "number" | "op", text, line, raw (source text)}.
-- Comments are dropped; long strings and long comments ([[ ]], [==[ ]==]) are understood.
function M.tokens(src)
  local out, i, n, line = {}, 1, #src, 1
  local function add(kind, text, l, raw) out[#out + 1] = { kind = kind, text = text, line = l, raw = raw or text } end
  local function long_bracket(at)   -- [=*[ at `at`: the closing position and the contents
    local eq = src:match("^%[(=*)%[", at)
    if not eq then return nil end
    local open_len = #eq + 2
    local close = "]" .. eq .. "]"
    local s, e = src:find(close, at + open_len, true)
    if not s then error(("unfinished long bracket at line %d"):format(line), 0) end
    return e, src:sub(at + open_len, s - 1)
  end
  while i <= n do
    local c = src:sub(i, i)
    if c == "\n" then line = line + 1; i = i + 1
    elseif c:match("%s") then i = i + 1
    elseif src:sub(i, i + 1) == "--" then
      local e, body = long_bracket(i + 2)
      if e then
        for _ in body:gmatch("\n") do line = line + 1 end
        i = e + 1
      else
        local nl = src:find("\n", i, true)
        i = nl or (n + 1)
      end
    elseif c == "[" and src:match("^%[=*%[", i) then
      local e, body = long_bracket(i)
      local l = line
      for _ in body:gmatch("\n") do line = line + 1 end
      add("string", (body:gsub("^\n", "")), l, src:sub(i, e))
      i = e + 1
    elseif c == '"' or c == "'" then
      local j, buf, l = i + 1, {}, line
      while true do
        local d = src:sub(j, j)
        if d == "" then error(("unfinished string at line %d"):format(l), 0) end
        if d == c then break end
        if d == "\\" then
          local e = src:sub(j + 1, j + 1)
          if e == "\n" then line = line + 1 end
          local map = { n = "\n", t = "\t", r = "\r", ["\\"] = "\\", ['"'] = '"', ["'"] = "'", a = "\a", b = "\b", f = "\f", v = "\v" }
          if map[e] then buf[#buf + 1] = map[e]; j = j + 2
          elseif e:match("%d") then
            local digits = src:match("^%d%d?%d?", j + 1)
            buf[#buf + 1] = string.char(tonumber(digits) % 256); j = j + 1 + #digits
          else buf[#buf + 1] = e; j = j + 2 end   -- \x.., \z, \u{}: the contents do not matter here
        else
          if d == "\n" then line = line + 1 end
          buf[#buf + 1] = d; j = j + 1
        end
      end
      add("string", table.concat(buf), l, src:sub(i, j))
      i = j + 1
    elseif c:match("[%a_]") then
      local word = src:match("^[%w_]+", i)
      add("name", word, line)
      i = i + #word
    elseif c:match("%d") or (c == "." and src:sub(i + 1, i + 1):match("%d")) then
      local num = src:match("^0[xX][%x%.]+[pP]?[%+%-]?%d*", i) or src:match("^[%d%.]+[eE]?[%+%-]?%d*", i)
      num = num .. (src:match("^[uUlLiI]+", i + #num) or "")
      add("number", num, line)
      i = i + #num
    else
      local op = src:match("^%.%.%.", i) or src:match("^[=~<>]=", i) or src:match("^%.%.", i) or src:match("^::", i) or c
      add("op", op, line)
      i = i + #op
    end
  end
  return out
end

-- The requires of a token list: { module = "remax.x" or nil (dynamic), line, text (as written) }.
local function requires_of(toks)
  local out = {}
  local function text_of(a, b)
    local parts = {}
    for k = a, b do
      local t = toks[k]
      parts[#parts + 1] = t.raw
    end
    local s = table.concat(parts, " ")
    return (s:gsub("([%w_]) %(", "%1("):gsub("%( ", "("):gsub(" %)", ")"):gsub(" ,", ","))
  end
  -- the closing parenthesis matching the one at k
  local function close_of(k)
    local depth = 0
    for j = k, #toks do
      local t = toks[j]
      if t.kind == "op" and (t.text == "(" or t.text == "{" or t.text == "[") then depth = depth + 1
      elseif t.kind == "op" and (t.text == ")" or t.text == "}" or t.text == "]") then
        depth = depth - 1
        if depth == 0 then return j end
      end
    end
    return #toks
  end
  for k, t in ipairs(toks) do
    if t.kind == "name" and t.text == "require" then
      local prev = toks[k - 1]
      local is_field = prev and prev.kind == "op" and (prev.text == "." or prev.text == ":")
      local nxt, nxt2, nxt3 = toks[k + 1], toks[k + 2], toks[k + 3]
      if is_field then
        -- a field named require (x.require): not Lua's require
      elseif nxt and nxt.kind == "string" then
        out[#out + 1] = { module = nxt.text, line = t.line, text = "require " .. nxt.raw }
      elseif nxt and nxt.kind == "op" and nxt.text == "(" then
        local close = close_of(k + 1)
        if nxt2 and nxt2.kind == "string" and nxt3 and nxt3.kind == "op" and nxt3.text == ")" then
          out[#out + 1] = { module = nxt2.text, line = t.line, text = "require(" .. nxt2.raw .. ")" }
        else
          out[#out + 1] = { line = t.line, text = text_of(k, close) }
        end
      elseif prev and prev.kind == "op" and prev.text == "(" and toks[k - 2] and toks[k - 2].text == "pcall"
        and nxt and nxt.kind == "op" and nxt.text == "," then
        -- pcall(require, "x")
        local close = close_of(k - 1)
        if nxt2 and nxt2.kind == "string" and nxt3 and nxt3.kind == "op" and nxt3.text == ")" then
          out[#out + 1] = { module = nxt2.text, line = t.line, text = "pcall(require, " .. nxt2.raw .. ")" }
        else
          out[#out + 1] = { line = t.line, text = text_of(k - 2, close) }
        end
      else
        out[#out + 1] = { line = t.line, text = "require used as a value" }
      end
    end
  end
  return out
end

-- C access through the FFI in a token list: { line, text }.
local function c_access_of(toks)
  local out, ffi_names = {}, {}
  for k, t in ipairs(toks) do   -- local x = require("ffi") / require "ffi"
    if t.kind == "name" and t.text == "require" then
      local s = toks[k + 1] and toks[k + 1].kind == "string" and toks[k + 1]
        or (toks[k + 1] and toks[k + 1].text == "(" and toks[k + 2] and toks[k + 2].kind == "string" and toks[k + 2])
      if s and s.text == "ffi" then
        local eq, name = toks[k - 1], toks[k - 2]
        if eq and eq.text == "=" and name and name.kind == "name" then ffi_names[name.text] = true end
      end
    end
  end
  for k, t in ipairs(toks) do
    local field, at
    if t.kind == "name" and ffi_names[t.text] and toks[k + 1] and toks[k + 1].text == "." and toks[k + 2] then
      field, at = toks[k + 2].text, k + 3
    elseif t.kind == "name" and t.text == "require" then   -- require("ffi").C, require "ffi".C
      local s, dot = toks[k + 1], k + 2
      if s and s.text == "(" then
        s, dot = toks[k + 2], k + 4
        if not (toks[k + 3] and toks[k + 3].text == ")") then s = nil end
      end
      if s and s.kind == "string" and s.text == "ffi" and toks[dot] and toks[dot].text == "." and toks[dot + 1] then
        field, at = toks[dot + 1].text, dot + 2
      end
    end
    if field and FFI_C[field] then
      out[#out + 1] = { line = t.line, text = "ffi." .. field }
    elseif field and FFI_TYPED[field] and toks[at] and toks[at].text == "(" and toks[at + 1]
      and toks[at + 1].kind == "string" and toks[at + 1].text:find("%f[%w_]rx_") then
      out[#out + 1] = { line = t.line, text = ("ffi.%s(%s): an engine type"):format(field, toks[at + 1].raw) }
    end
  end
  return out
end

-- Every Lua file under lua/remax, sorted.
function M.files(root)
  local list = {}
  local p = io.popen("cd '" .. root .. "' && find lua/remax -name '*.lua' | sort")
  for f in p:lines() do list[#list + 1] = f end
  p:close()
  return list
end

-- lua/remax/run/run.lua -> "run"; lua/remax/init.lua -> "."
local function folder_of(path)
  return path:match("^lua/remax/([^/]+)/") or "."
end

local layer_rank, layer_name = {}, {}
for r, layer in ipairs(M.LAYERS) do
  for _, f in ipairs(layer.folders) do layer_rank[f], layer_name[f] = r, layer.name end
end

-- "remax.run.folder" -> "lua/remax/run/folder.lua" (or its init.lua) when that file exists
local function module_file(root, mod, exists)
  local base = "lua/" .. mod:gsub("%.", "/")
  for _, cand in ipairs({ base .. ".lua", base .. "/init.lua" }) do
    if exists[cand] then return cand end
  end
  return nil
end

-- Strongly connected components of a graph {node -> {node -> edge}} (Tarjan), those with more
-- than one node, each as a sorted list.
local function cycles_of(graph)
  local index, low, on, stack, out, counter = {}, {}, {}, {}, {}, 0
  local nodes = {}
  for v in pairs(graph) do nodes[#nodes + 1] = v end
  table.sort(nodes)
  local function visit(v)
    counter = counter + 1
    index[v], low[v] = counter, counter
    stack[#stack + 1], on[v] = v, true
    local targets = {}
    for w in pairs(graph[v] or {}) do targets[#targets + 1] = w end
    table.sort(targets)
    for _, w in ipairs(targets) do
      if not index[w] then visit(w); low[v] = math.min(low[v], low[w])
      elseif on[w] then low[v] = math.min(low[v], index[w]) end
    end
    if low[v] == index[v] then
      local comp = {}
      repeat
        local w = table.remove(stack)
        on[w] = nil
        comp[#comp + 1] = w
      until w == v
      if #comp > 1 then table.sort(comp); out[#out + 1] = comp end
    end
  end
  for _, v in ipairs(nodes) do if not index[v] then visit(v) end end
  return out
end

-- One cycle through the component, as the edges {from, to, edge} it takes, from its first node.
local function cycle_path(graph, comp)
  local inside = {}
  for _, v in ipairs(comp) do inside[v] = true end
  local start = comp[1]
  -- breadth-first from start back to start, inside the component
  local prev, queue, seen = {}, { start }, { [start] = true }
  local qi = 1
  while qi <= #queue do
    local v = queue[qi]; qi = qi + 1
    local targets = {}
    for w in pairs(graph[v]) do if inside[w] then targets[#targets + 1] = w end end
    table.sort(targets)
    for _, w in ipairs(targets) do
      if w == start then
        local path, at = { { from = v, to = start, edge = graph[v][start] } }, v
        while at ~= start do
          local p = prev[at]
          table.insert(path, 1, { from = p, to = at, edge = graph[p][at] })
          at = p
        end
        return path
      end
      if not seen[w] then seen[w], prev[w] = true, v; queue[#queue + 1] = w end
    end
  end
end

-- The problems of the tree at root ("." by default): a sorted list of "file:line: message".
-- opts.aliases: old module name -> new (the alias table), for "an old name" messages.
function M.check(root, opts)
  root = root or "."
  opts = opts or {}
  local problems = {}
  local function bad(file, line, msg) problems[#problems + 1] = { file = file, line = line, msg = msg } end
  local files = M.files(root)
  local exists = {}
  for _, f in ipairs(files) do exists[f] = true end
  local file_graph, folder_graph = {}, {}
  for _, f in ipairs(files) do
    local folder = folder_of(f)
    local rank = layer_rank[folder]
    if not rank then
      bad(f, 1, ("lua/remax/%s/ is in no layer (tests/layers.lua's LAYERS)"):format(folder))
    end
    local ok, toks = pcall(M.tokens, read(root .. "/" .. f))
    if not ok then
      bad(f, 1, "cannot read its tokens: " .. tostring(toks))
      toks = {}
    end
    file_graph[f] = file_graph[f] or {}
    folder_graph[folder] = folder_graph[folder] or {}
    for _, r in ipairs(requires_of(toks)) do
      if not r.module then
        local allowed = M.DYNAMIC[f] and M.DYNAMIC[f][r.text]
        if not allowed then
          bad(f, r.line, ("%s: a require whose module is not a string cannot be checked (write the name, or add it to tests/layers.lua's DYNAMIC with the reason)")
            :format(r.text))
        end
      elseif r.module == "remax" or r.module:match("^remax%.") then
        local target = module_file(root, r.module, exists)
        if not target then
          local new = opts.aliases and opts.aliases[r.module]
          bad(f, r.line, new and ('%s: an old name; the module is "%s"'):format(r.text, new)
            or ("%s: no such module under lua/remax"):format(r.text))
        else
          local tfolder = folder_of(target)
          local trank = layer_rank[tfolder]
          if rank and trank and trank < rank then
            bad(f, r.line, ("%s: requires up, from %s/ (layer %s) to %s/ (layer %s)"):format(r.text, folder,
              layer_name[folder], tfolder, layer_name[tfolder]))
          end
          if r.module == "remax.bind.ffi" and folder ~= "bind" then
            bad(f, r.line, ("%s: the engine's C handle outside bind/ (bind/ is the only door to C)"):format(r.text))
          end
          if target ~= f then
            file_graph[f][target] = file_graph[f][target] or { file = f, line = r.line }
            if tfolder ~= folder then
              folder_graph[folder][tfolder] = folder_graph[folder][tfolder] or { file = f, line = r.line }
            end
          end
        end
      end
    end
    if folder ~= "bind" then
      for _, c in ipairs(c_access_of(toks)) do
        bad(f, c.line, ("%s: C access outside bind/ (bind/ is the only door to C: call a bind/ function)"):format(c.text))
      end
    end
  end
  for _, pair in ipairs({ { folder_graph, "folders" }, { file_graph, "files" } }) do
    local graph, what = pair[1], pair[2]
    for _, comp in ipairs(cycles_of(graph)) do
      local path = cycle_path(graph, comp)
      local names, where = {}, {}
      for _, e in ipairs(path) do
        names[#names + 1] = what == "folders" and (e.from .. "/") or e.from:gsub("^lua/remax/", "")
        where[#where + 1] = ("%s:%d"):format(e.edge.file, e.edge.line)
      end
      names[#names + 1] = names[1]
      local first = path[1].edge
      bad(first.file, first.line, ("%s require each other in a circle: %s (at %s)"):format(what,
        table.concat(names, " -> "), table.concat(where, ", ")))
    end
  end
  table.sort(problems, function(a, b)
    if a.file ~= b.file then return a.file < b.file end
    if a.line ~= b.line then return a.line < b.line end
    return a.msg < b.msg
  end)
  local out = {}
  for i, p in ipairs(problems) do out[i] = ("%s:%d: %s"):format(p.file, p.line, p.msg) end
  return out
end

if arg and arg[0] and arg[0]:match("layers%.lua$") and not package.loaded["layers"] then
  package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
  local okd, deprecated = pcall(require, "remax.deprecated")
  local problems = M.check(".", { aliases = okd and type(deprecated) == "table" and deprecated.aliases or nil })
  for _, p in ipairs(problems) do print(p) end
  if #problems > 0 then
    io.stderr:write(("layering: %d problem(s) (docs/architecture.md, \"Layers that hold\")\n"):format(#problems))
    os.exit(1)
  end
  print("layering: every require goes down, no circles, C only through bind/")
end

return M
