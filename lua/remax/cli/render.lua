-- remax.cli.render: `remax render RECIPE.lua [--key value ...] [--row N]` prints the first
-- prompt of a run exactly as the model sees it: the token ids of the first step's first prompt
-- (or of dataset row N), decoded with their special tokens. The chat template, the tools the
-- template lists, an environment's first messages (its reset, with the prompt's seed) and the
-- cut to max_prompt_length are all in it. The model's weights are not loaded: only its
-- tokenizer. stdout holds the prompt alone; a line on stderr says where it came from.
local config = require("remax.settings.config")
local setup = require("remax.run.setup")
local policy_mod = require("remax.step.policy")
local episodes = require("remax.step.episodes")
local rewards = require("remax.step.rewards")

local M = {}

M.usage = [[usage: remax render RECIPE.lua [--row N] [--key value ...]
  prints the first prompt of the run exactly as the model sees it (chat template, tools and an
  environment's first messages included): the first prompt of step 1, or dataset row N]]

-- "--row N" taken out of the arguments: N (nil when absent) and the other arguments.
local function take_row(argv)
  local rest, row = {}, nil
  local i = 1
  while i <= #argv do
    local a = argv[i]
    local v = a:match("^%-%-row=(.*)$")
    if a == "--row" then v = argv[i + 1]; i = i + 1 end
    if v then
      row = tonumber(v)
      if not row or row < 1 or row ~= math.floor(row) then
        error(("remax render: --row %s: expected a row number from 1"):format(tostring(v)), 0)
      end
    else
      rest[#rest + 1] = a
    end
    i = i + 1
  end
  return row, rest
end

-- The first prompt of cfg's run: its text as the model sees it, and what it is (a table:
-- ids, row (the dataset row's number or nil), source, cut, messages).
function M.first_prompt(cfg, opts)
  opts = opts or {}
  if cfg.algo == "reward" then error("remax render: algo = reward trains on preference pairs, not prompts", 0) end
  local prompts_per_step = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
  local p = setup.prompt_pieces(cfg, { recipe_dir = opts.recipe_dir, prompts_per_step = prompts_per_step })
  local rows = p.train_ds.rows
  local row, which
  if opts.row then
    row = rows[opts.row]
    if not row then error(("remax render: --row %d: the training data has %d rows"):format(opts.row, #rows), 0) end
    which = ("row %d of %s"):format(opts.row, p.train_ds.source or "the training data")
  else   -- the run's first prompt: the first of step 1's batch, in the run's data order
    row = p.train_ds:sampler({ seed = cfg.seed, shuffle = true, batch_size = prompts_per_step }):next_batch()[1]
    which = ("the first prompt of step 1 (%s)"):format(p.train_ds.source or "the training data")
  end
  -- the Policy that encodes prompts (remax.step.policy), without a model
  local policy = policy_mod.new({ tok = p.tok, template = p.template, template_name = p.template_name, rewards = {},
    train_ds = p.train_ds, recipe_dir = opts.recipe_dir }, cfg)
  local ids, cut, messages
  if episodes.wanted(cfg) then
    local s
    local ok, a, b, c = pcall(function()
      s = episodes.setup(policy)   -- the tools and environment, checked
      return episodes.first_prompt(policy, row, { step = 1, first = 1, setup = s })
    end)
    if s and s.registry then s.registry:close() end   -- py: and cmd: workers end with the command
    if not ok then error(a, 0) end
    messages, ids, cut = a, b, c
  else
    local before
    ids, _, before = policy:encode_prompt(row.prompt)
    cut = before ~= nil
  end
  local text = p.tok:decode(ids, { skip_special_tokens = false })
  return text, { ids = ids, source = which, cut = cut, messages = messages, template_name = p.template_name }
end

function M.main(file, ...)
  if file == nil or file == "--help" or file == "-h" or file == "help" then
    print(M.usage)
    return file == nil and 2 or 0
  end
  local row, argv = take_row({ ... })
  local recipe = require("remax.settings.recipe").load(file, unpack(argv))
  local overrides, help = config.parse_args(argv)
  local cfg = config.resolve(recipe, overrides, { where = file, running = true })
  if help then
    print(M.usage)
    print(config.help(cfg, ("remax render %s: settings (recipe values, then --key value overrides):"):format(file)))
    return 0
  end
  local text, info = M.first_prompt(cfg, { row = row, recipe_dir = rewards.dirname(file) })
  io.stderr:write(("remax render: %s, %d tokens, template %s%s\n"):format(info.source, #info.ids, info.template_name,
    info.cut and (", cut to its last max_prompt_length = %d tokens"):format(cfg.max_prompt_length) or ""))
  io.stdout:write(text)   -- as it is: a newline after it would be one the model does not see
  return 0
end

return M
