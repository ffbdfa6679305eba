-- remax.deprecated: old module names that keep working for a while after a module moves, in one
-- table (old name -> new name) read by one loader. The first require of an old name says once,
-- on stderr, where the module lives now; set REMAX_QUIET_DEPRECATED=1 to silence it. The loader
-- is installed by M.register(), which the package face (require("remax")) and the remax
-- program's start (remax.cli.main) call; requiring this module installs nothing.
local M = {}

M.aliases = {
  -- the names from before the bind/ text/ train/ split (require("remax").<name> is the public face)
  ["remax.algos"] = "remax.step.algos",
  ["remax.chat"] = "remax.text.chat",
  ["remax.config"] = "remax.settings.config",
  ["remax.data"] = "remax.formats.data",
  ["remax.dist"] = "remax.bind.dist",
  ["remax.fit"] = "remax.step.fit",
  ["remax.gguf"] = "remax.formats.gguf",
  ["remax.jinja"] = "remax.text.jinja",
  ["remax.lora"] = "remax.bind.lora",
  ["remax.model"] = "remax.bind.model",
  ["remax.optim"] = "remax.bind.optim",
  ["remax.plot"] = "remax.run.plot",
  ["remax.progress"] = "remax.run.progress",
  ["remax.recipe"] = "remax.settings.recipe",
  ["remax.reward_model"] = "remax.step.model_reward",
  ["remax.rewards"] = "remax.step.rewards",
  ["remax.runs"] = "remax.run.folder",
  ["remax.safetensors"] = "remax.bind.safetensors",
  ["remax.tensor"] = "remax.bind.tensor",
  ["remax.tokenizer"] = "remax.bind.tokenizer",
  ["remax.trainer"] = "remax.run.run",
  -- the train/ names, from before the Run / Step split
  ["remax.train.algos"] = "remax.step.algos",
  ["remax.train.config"] = "remax.settings.config",
  ["remax.train.data"] = "remax.formats.data",
  ["remax.train.evaluate"] = "remax.step.evaluate",
  ["remax.train.fit"] = "remax.step.fit",
  ["remax.train.guard"] = "remax.step.guard",
  ["remax.train.inert"] = "remax.settings.inert",
  ["remax.train.plot"] = "remax.run.plot",
  ["remax.train.progress"] = "remax.run.progress",
  ["remax.train.recipe"] = "remax.settings.recipe",
  ["remax.train.reload"] = "remax.run.reload",
  ["remax.train.report"] = "remax.run.report",
  ["remax.train.resume"] = "remax.run.resume",
  ["remax.train.reward_worker"] = "remax.step.reward_worker",
  ["remax.train.rewards"] = "remax.step.rewards",
  ["remax.train.rollout"] = "remax.step.rollout",
  ["remax.train.run"] = "remax.run.run",
  ["remax.train.runs"] = "remax.run.folder",
  ["remax.train.schema"] = "remax.settings.schema",
  ["remax.train.setup"] = "remax.run.setup",
  ["remax.train.tensorboard"] = "remax.run.tensorboard",
  ["remax.train.trainer"] = "remax.run.run",
  -- formats that lived among the bindings
  ["remax.bind.gguf"] = "remax.formats.gguf",
  ["remax.bind.hf_cache"] = "remax.formats.hf_cache",
  -- moved so that requires only go down (issue 43)
  ["remax.step.data"] = "remax.formats.data",        -- tasks/ make datasets
  ["remax.formats.hf_files"] = "remax.bind.hf_files",   -- the model and tokenizer bindings check those files
  ["remax.bind.reward_model"] = "remax.step.model_reward",   -- "model:" rewards; their C calls are bind/classifier's
}

local said = {}

-- The module `new`, required under its old name `old`: the note once per old name, then the module.
function M.moved(old, new)
  if not said[old] and os.getenv("REMAX_QUIET_DEPRECATED") ~= "1" then
    said[old] = true
    io.stderr:write(("remax: require(%q) is deprecated: the module is now %q (use require(\"remax\") where you can)\n")
      :format(old, new))
  end
  return require(new)
end

-- The searcher: a loader for an old name, nothing for any other (a file of that name, found by
-- the searchers before this one, always wins).
local function search(name)
  local new = M.aliases[name]
  if not new then return nil end
  return function(old) return M.moved(old, new) end
end

-- Installs the searcher after Lua's own (package.loaders in LuaJIT, package.searchers in
-- Lua 5.2+), once however often it is called.
function M.register()
  local searchers = package.searchers or package.loaders
  for _, s in ipairs(searchers) do if s == search then return end end
  searchers[#searchers + 1] = search
end

return M
