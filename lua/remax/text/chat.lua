-- remax.text.chat: turn a prompt (a string, or a list of {role=, content=} messages) into the text a
-- chat model expects, and that text into token ids. The tokenizer's own chat_template (from
-- tokenizer_config.json or chat_template.jinja) runs as written through remax.text.jinja, with the
-- variables transformers passes; built-in templates "chatml" (Qwen), "llama3", "plain" and "qa" serve
-- tokenizers that have none, and a recipe can pass its own function(messages, opts) -> string.
local jinja = require("remax.text.jinja")

local M = {}

M.roles = { system = true, user = true, assistant = true, tool = true }
local ROLE_LIST = "system, user, assistant, tool"

-- Qwen2.5's chat_template inserts this system message when the conversation has none.
M.QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

-- Check one conversation. Returns true, or nil and a message naming the message index at fault.
function M.check_messages(messages)
  if type(messages) ~= "table" then
    return nil, "expected a string or a list of {role=, content=} messages, got " .. type(messages)
  end
  if #messages == 0 then return nil, "empty list of messages" end
  for i, m in ipairs(messages) do
    if type(m) ~= "table" then
      return nil, ("message %d is a %s, expected a table {role=, content=}"):format(i, type(m))
    end
    if type(m.role) ~= "string" or not M.roles[m.role] then
      return nil, ("message %d has role %s (valid: %s)"):format(i,
        type(m.role) == "string" and ("'" .. m.role .. "'") or type(m.role), ROLE_LIST)
    end
    if type(m.content) ~= "string" then
      return nil, ("message %d (%s) has content of type %s, expected a string"):format(i, m.role, type(m.content))
    end
  end
  return true
end

-- A string prompt is one user message.
function M.messages(prompt)
  if type(prompt) == "string" then return { { role = "user", content = prompt } } end
  local ok, err = M.check_messages(prompt)
  if not ok then error("remax.chat: " .. err, 3) end
  return prompt
end

local function chatml(messages, opts)
  local out = {}
  local default_system = opts.default_system
  if default_system and messages[1].role ~= "system" then
    out[#out + 1] = "<|im_start|>system\n" .. default_system .. "<|im_end|>\n"
  end
  for _, m in ipairs(messages) do
    out[#out + 1] = "<|im_start|>" .. m.role .. "\n" .. m.content .. "<|im_end|>\n"
  end
  if opts.add_generation_prompt then out[#out + 1] = "<|im_start|>assistant\n" end
  return table.concat(out)
end

local function trim(s) return (s:gsub("^%s+", ""):gsub("%s+$", "")) end

-- Llama 3's template trims each message's content and starts with the BOS token
-- (add_bos = false when the tokenizer already prepends it).
local function llama3(messages, opts)
  local out = {}
  if opts.add_bos ~= false then out[1] = "<|begin_of_text|>" end
  for _, m in ipairs(messages) do
    out[#out + 1] = "<|start_header_id|>" .. m.role .. "<|end_header_id|>\n\n" .. trim(m.content) .. "<|eot_id|>"
  end
  if opts.add_generation_prompt then out[#out + 1] = "<|start_header_id|>assistant<|end_header_id|>\n\n" end
  return table.concat(out)
end

-- Role-less: the contents joined by a blank line (a single user message is just its content).
-- For base models trained on raw text; add_generation_prompt adds nothing.
local function plain(messages, opts)
  local out = {}
  for i, m in ipairs(messages) do out[i] = m.content end
  return table.concat(out, opts.separator or "\n\n")
end

-- "Question: ...\nAnswer: ": the format of the built-in byte-level models (models/tiny-gsm8k).
local function qa(messages, opts)
  local out = {}
  for _, m in ipairs(messages) do
    if m.role == "assistant" then out[#out + 1] = "Answer: " .. m.content .. "\n"
    elseif m.role == "system" then out[#out + 1] = m.content .. "\n"
    else out[#out + 1] = "Question: " .. m.content .. "\n" end
  end
  if opts.add_generation_prompt ~= false then out[#out + 1] = "Answer: " end
  return table.concat(out)
end

M.templates = { chatml = chatml, llama3 = llama3, plain = plain, qa = qa }
local TEMPLATE_LIST = "'chatml', 'llama3', 'plain', 'qa' or a function(messages, opts) -> string"

-- Why tok has no chat template: none at all, or (tok.chat_template_names) a list of named
-- templates in tokenizer_config.json without a "default" one, naming what the list has.
function M.no_template(tok)
  local names = tok and tok.chat_template_names
  if names then
    return ("the tokenizer's chat_template in %s is a list of named templates without a 'default' entry (it has: %s); "
      .. "remax, as transformers, uses none of them unless told which: put the one to use in chat_template.jinja beside "
      .. "tokenizer.json (then chat_template = tokenizer)"):format(tok.chat_template_file or "tokenizer_config.json",
      #names > 0 and table.concat(names, ", ") or "no named entry")
  end
  return "the tokenizer has no chat_template (in tokenizer_config.json or chat_template.jinja)"
end

-- The built-in template of the same kind as a tokenizer_config.json chat_template (a Jinja
-- string), for template = 'chatml' / 'llama3' to take the tokenizer's defaults (Qwen2.5's
-- system message). Returns name, options; or nil, reason.
function M.detect(template_string)
  if type(template_string) ~= "string" or template_string == "" then
    return nil, "the tokenizer has no chat_template"
  end
  if template_string:find("<|im_start|>", 1, true) then
    local opts = {}
    if template_string:find(M.QWEN_DEFAULT_SYSTEM, 1, true) then opts.default_system = M.QWEN_DEFAULT_SYSTEM end
    return "chatml", opts
  end
  if template_string:find("<|start_header_id|>", 1, true) then return "llama3", {} end
  return nil, "the tokenizer's chat_template has neither <|im_start|> (chatml) nor <|start_header_id|> (llama3) markers"
end

local compiled = setmetatable({}, { __mode = "k" })   -- tokenizer -> {source =, template =}

-- The byte offset of the first byte of s that is not UTF-8 (overlong forms, surrogates and
-- code points past U+10FFFF included), or nil.
local function utf8_error(s)
  if not s:find("[\128-\255]") then return nil end
  local i, n, byte = 1, #s, string.byte
  while i <= n do
    local c = byte(s, i)
    if c < 0x80 then i = i + 1
    else
      local len, lo, hi = 0, 0x80, 0xBF
      if c >= 0xC2 and c <= 0xDF then len = 2
      elseif c >= 0xE0 and c <= 0xEF then
        len = 3
        if c == 0xE0 then lo = 0xA0 elseif c == 0xED then hi = 0x9F end
      elseif c >= 0xF0 and c <= 0xF4 then
        len = 4
        if c == 0xF0 then lo = 0x90 elseif c == 0xF4 then hi = 0x8F end
      else return i end
      for k = 1, len - 1 do
        local d = byte(s, i + k)
        if not d or d < (k == 1 and lo or 0x80) or d > (k == 1 and hi or 0xBF) then return i end
      end
      i = i + len
    end
  end
  return nil
end
M.utf8_error = utf8_error

-- The tokenizer's chat_template, compiled once per tokenizer.
local function tokenizer_template(tok)
  local c = compiled[tok]
  if c and c.source == tok.chat_template then return c.template end
  local where = (tok.chat_template_path or ((tok.path or "tokenizer") .. " chat_template"))
  local bad = utf8_error(tok.chat_template)
  if bad then   -- transformers reads a template as UTF-8 and stops on this too
    local _, newlines = tok.chat_template:sub(1, bad - 1):gsub("\n", "")
    error(("%s: not valid UTF-8: byte %d (line %d) is 0x%02X; save the template as UTF-8 (e.g. iconv -f latin1 -t utf-8)")
      :format(where, bad, newlines + 1, tok.chat_template:byte(bad)), 0)
  end
  local t = jinja.compile(tok.chat_template, where)
  compiled[tok] = { source = tok.chat_template, template = t }
  return t
end

-- The reasoning of an assistant turn under each name templates read, as transformers gives it:
-- `reasoning_content` = the first of reasoning_content, thinking, reasoning that is set, and
-- `thinking` too when the message has none (Qwen3 reads the one, gpt-oss the other).
local REASONING = { "reasoning_content", "thinking", "reasoning" }
local function alias_reasoning(messages)
  local out = messages
  for i, m in ipairs(messages) do
    local r
    for _, k in ipairs(REASONING) do
      if m[k] ~= nil then r = m[k] break end
    end
    if r ~= nil and (m.reasoning_content ~= r or m.thinking == nil) then
      if out == messages then out = { unpack(messages) } end
      local c = {}
      for k, v in pairs(m) do c[k] = v end
      c.thinking = m.thinking ~= nil and m.thinking or r
      c.reasoning_content = r
      out[i] = c
    end
  end
  return out
end

-- Renders the tokenizer's template with what transformers' apply_chat_template passes:
-- messages (their reasoning under each name), add_generation_prompt, tools = None, documents = None, the special tokens the
-- tokenizer names (bos_token, eos_token, pad_token, unk_token), enable_thinking when given
-- (Qwen3), and the recipe's template_args on top.
local function render_tokenizer_template(messages, opts)
  local tok = opts.tokenizer
  local named = tok.special_tokens or tok
  local vars = { messages = alias_reasoning(messages), add_generation_prompt = opts.add_generation_prompt, tools = jinja.none,
    documents = jinja.none, bos_token = named.bos_token, eos_token = named.eos_token, pad_token = named.pad_token,
    unk_token = named.unk_token }
  if opts.enable_thinking ~= nil then vars.enable_thinking = opts.enable_thinking end
  for k, v in pairs(opts.template_args or {}) do vars[k] = v end
  return tokenizer_template(tok):render(vars)
end

-- Resolve opts.template / opts.tokenizer into (function, merged options, from the tokenizer).
local function resolve(opts)
  local template = opts.template
  local merged = {}
  for k, v in pairs(opts) do merged[k] = v end
  if merged.add_generation_prompt == nil then merged.add_generation_prompt = true end
  if type(template) == "function" then return template, merged, false end
  if template == nil or template == "tokenizer" then
    local tok = opts.tokenizer
    if tok ~= nil and type(tok.chat_template) == "string" and tok.chat_template ~= "" then
      return render_tokenizer_template, merged, true
    end
    if template == "tokenizer" then
      error("remax.chat: template = 'tokenizer', but " .. M.no_template(tok) .. "; or pass template = " .. TEMPLATE_LIST, 3)
    end
  end

  local detected, detected_opts
  if opts.tokenizer ~= nil then
    detected, detected_opts = M.detect(opts.tokenizer.chat_template)
  end
  if template == nil then
    if opts.tokenizer == nil then
      error("remax.chat: no template given (valid: " .. TEMPLATE_LIST .. ", or tokenizer = tok for its chat_template)", 3)
    end
    error("remax.chat: " .. M.no_template(opts.tokenizer) .. "; or pass template = " .. TEMPLATE_LIST, 3)
  end
  local fn = M.templates[template]
  if not fn then
    error(("remax.chat: unknown template %s (valid: %s)"):format(
      type(template) == "string" and ("'" .. template .. "'") or (tostring(template) .. " (a " .. type(template) .. ")"),
      TEMPLATE_LIST), 3)
  end
  -- The tokenizer's own template decides defaults (Qwen2.5's system message) when it is the same kind.
  if detected == template then
    for k, v in pairs(detected_opts) do
      if merged[k] == nil then merged[k] = v end
    end
  end
  if merged.default_system == false then merged.default_system = nil end
  return fn, merged, false
end

-- Renders and says whether the tokenizer's own template did it.
local function render(prompt, opts)
  opts = opts or {}
  local messages = M.messages(prompt)
  local fn, merged, from_tokenizer = resolve(opts)
  local text = fn(messages, merged)
  if type(text) ~= "string" then
    error("remax.chat: the template function returned a " .. type(text) .. ", expected a string", 3)
  end
  return text, from_tokenizer
end

-- render(prompt, {template=, add_generation_prompt=true, tokenizer=, enable_thinking=,
-- template_args=, default_system=, add_bos=}) -> text. Without template, the tokenizer's
-- chat_template runs.
function M.render(prompt, opts)
  local text = render(prompt, opts)
  return text
end

-- Why a template cannot show a model its tools, or nil when it can: opts (render's) with
-- template_args.tools listing a tool named probe_name. Rendered is a conversation with a tool
-- result (user, assistant, tool), as TRL's supports_tool_calling renders one; the tool's name
-- (the tools section) and the result must both be in the text.
function M.tools_problem(opts, probe_name)
  local result = "remax_tool_result_probe_c4f9a8"
  local ok, text = pcall(M.render, { { role = "user", content = "hi" }, { role = "assistant", content = "" },
    { role = "tool", content = result } }, opts)
  if not ok then return "it fails on a conversation with a tool result: " .. tostring(text) end
  if not text:find(probe_name, 1, true) then return "it has no tools section (the tools it is given are not in its text)" end
  if not text:find(result, 1, true) then return "it drops tool results" end
  return nil
end

-- Token ids of a rendered prompt. The tokenizer's template writes its own special tokens, so
-- (as transformers does for chat prompts) none are added; other text gets the tokenizer's
-- special tokens (a BOS, say) unless it already starts with the BOS text: BOS exactly once.
function M.encode_text(tok, text, from_tokenizer)
  local add = not from_tokenizer
  if add and tok.bos_token and tok.bos_token ~= "" and text:sub(1, #tok.bos_token) == tok.bos_token then add = false end
  return tok:encode(text, { add_special_tokens = add })
end

-- Render, then encode with the tokenizer (opts.tokenizer defaults to tok). Returns ids, text.
function M.encode(tok, prompt, opts)
  local o = {}
  for k, v in pairs(opts or {}) do o[k] = v end
  if o.tokenizer == nil then o.tokenizer = tok end
  local text, from_tokenizer = render(prompt, o)
  return M.encode_text(tok, text, from_tokenizer), text
end

return M
