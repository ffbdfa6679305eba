-- remax.settings.registry: the algorithms and TRL loss types the settings know. The records are the
-- step's (one file each in step/algos/ and step/loss_types/); remax.step.algos.register() hands them
-- here, called where the program starts (cli/main.lua), by the package face (init.lua) and by the
-- specs' support.lua. The settings read from them the choices of `algo` and `loss_type`, what the
-- checks ask (the greedy row, the fewest generations), derived values (a loss type's aggregation)
-- and which settings act (an algorithm's or a loss type's own settings).
--
-- What the settings read of an algorithm record (remax.step.algos documents the rest):
--   name, rank (its place in lists), choice (its words in `algo`'s help), samples (trains on
--   sampled completions: an RL algorithm), needs_greedy (nil, or why it needs the greedy row),
--   min_generations (and min_generations_why), settings (the settings it alone reads),
--   estimator (a recipe `advantage` function replaces it: its settings then do nothing).
-- Of a loss type record: name, rank, aggregation, settings (those it alone reads) and their
--   defaults, ignores ({setting = why}: shared settings it does without), on_policy (settings that
--   act even at ratio 1, num_iterations = 1).
local M = {}

local lists = { algorithms = {}, loss_types = {} }

local function add(kind, rec)
  assert(type(rec) == "table" and type(rec.name) == "string" and type(rec.rank) == "number",
    "registry: a record needs a name and a rank")
  local list = lists[kind]
  for i, r in ipairs(list) do
    if r.name == rec.name then list[i] = rec return end
  end
  list[#list + 1] = rec
  table.sort(list, function(a, b) return a.rank < b.rank end)
end

function M.add_algorithm(rec) add("algorithms", rec) end
function M.add_loss_type(rec) add("loss_types", rec) end

-- "algorithms" | "loss_types" -> the records, in rank order
function M.list(kind)
  local list = assert(lists[kind], "registry: no list " .. tostring(kind))
  if #list == 0 then
    error(("remax.settings: no %s registered; call require(\"remax.step.algos\").register() first (the program, "
      .. "require(\"remax\") and the specs' support.lua do)"):format(kind:gsub("_", " ")), 0)
  end
  return list
end

function M.names(kind)
  local out = {}
  for i, r in ipairs(M.list(kind)) do out[i] = r.name end
  return out
end

local function find(kind, name)
  for _, r in ipairs(M.list(kind)) do if r.name == name then return r end end
  return nil
end

function M.algorithm(name) return find("algorithms", name) end
function M.loss_type(name) return name ~= nil and find("loss_types", name) or nil end

return M
