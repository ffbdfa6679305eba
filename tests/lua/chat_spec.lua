local cjson = require("cjson")
local chat = require("remax").chat

local support = require("support")
local read = support.read

local TEMPLATES = cjson.decode(read("tests/fixtures/data/chat_templates.json"))

-- A stand-in tokenizer: the chat module only uses chat_template, the role tokens and encode
-- (bytes; 1 stands for the special tokens the post-processor would add).
local function fake_tokenizer(template, bos)
  return {
    chat_template = template, eos_id = 0, bos_token = bos, eos_token = "<|im_end|>",
    encode = function(_, text, opts)
      local ids = { string.byte(text, 1, -1) }
      if not opts or opts.add_special_tokens ~= false then table.insert(ids, 1, 1) end
      return ids
    end,
  }
end

local convo = {
  { role = "system", content = "Be brief." },
  { role = "user", content = "Hi" },
  { role = "assistant", content = "Hello." },
  { role = "user", content = "2+2?" },
}

describe("chat", function()
  it("renders chatml with and without the generation prompt", function()
    local body = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n" ..
      "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
    assert.are.equal(body .. "<|im_start|>assistant\n", chat.render(convo, { template = "chatml" }))
    assert.are.equal(body, chat.render(convo, { template = "chatml", add_generation_prompt = false }))
  end)

  it("adds Qwen2.5's default system message only when its template has it", function()
    local qwen25, plain_chatml = fake_tokenizer(TEMPLATES["qwen2.5"]), fake_tokenizer(TEMPLATES.chatml)
    local sys = "<|im_start|>system\n" .. chat.QWEN_DEFAULT_SYSTEM .. "<|im_end|>\n"
    local user = "<|im_start|>user\nWhat is 3*4?<|im_end|>\n<|im_start|>assistant\n"
    assert.are.equal(sys .. user, chat.render("What is 3*4?", { tokenizer = qwen25 }))
    assert.are.equal(user, chat.render("What is 3*4?", { tokenizer = plain_chatml }))
    assert.are.equal(user, chat.render("What is 3*4?", { template = "chatml" }))
    assert.are.equal(user, chat.render("What is 3*4?", { template = "chatml", tokenizer = qwen25, default_system = false }))
    assert.are.equal(sys .. user, chat.render("What is 3*4?", { template = "chatml", tokenizer = qwen25 }))
    -- a conversation with its own system message keeps it and gets no default
    local own = chat.render(convo, { template = "chatml", tokenizer = qwen25 })
    assert.is_nil(own:find(chat.QWEN_DEFAULT_SYSTEM, 1, true))
    assert.are.equal(1, select(2, own:gsub("<|im_start|>system", "")))
  end)

  it("renders llama3, trimming content, with an optional BOS", function()
    local msgs = { { role = "user", content = "  Hi there \n" } }
    local expect = "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>" ..
      "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assert.are.equal("<|begin_of_text|>" .. expect, chat.render(msgs, { template = "llama3" }))
    assert.are.equal(expect, chat.render(msgs, { template = "llama3", add_bos = false }))
    assert.are.equal("<|begin_of_text|>" .. expect,
      chat.render(msgs, { tokenizer = fake_tokenizer(TEMPLATES.llama3, "<|begin_of_text|>") }))
  end)

  it("renders plain prompts role-less", function()
    assert.are.equal("What is 2+2?", chat.render("What is 2+2?", { template = "plain" }))
    assert.are.equal("Be brief.\n\nHi", chat.render({ convo[1], convo[2] }, { template = "plain" }))
  end)

  it("treats a string prompt as one user message", function()
    assert.are.equal(chat.render({ { role = "user", content = "x" } }, { template = "llama3" }),
      chat.render("x", { template = "llama3" }))
  end)

  it("detects templates from their markers", function()
    local name, opts = chat.detect(TEMPLATES["qwen2.5"])
    assert.are.equal("chatml", name)
    assert.are.equal(chat.QWEN_DEFAULT_SYSTEM, opts.default_system)
    name, opts = chat.detect(TEMPLATES.chatml)
    assert.are.equal("chatml", name)
    assert.is_nil(opts.default_system)
    assert.are.equal("llama3", (chat.detect(TEMPLATES.llama3)))
    local none, why = chat.detect(TEMPLATES.other)
    assert.is_nil(none)
    assert.matches("im_start", why, 1, true)
    assert.is_nil((chat.detect(nil)))
  end)

  it("accepts a recipe's own template function", function()
    local seen
    local fn = function(messages, opts)
      seen = opts
      local parts = {}
      for i, m in ipairs(messages) do parts[i] = m.role:upper() .. ": " .. m.content end
      return table.concat(parts, "\n") .. (opts.add_generation_prompt and "\nASSISTANT:" or "")
    end
    assert.are.equal("USER: hi\nASSISTANT:", chat.render("hi", { template = fn }))
    assert.is_true(seen.add_generation_prompt)
  end)

  it("encodes through the tokenizer object", function()
    local tok = fake_tokenizer(TEMPLATES.chatml)
    local ids = chat.encode(tok, "hi")
    assert.are.equal("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", string.char(unpack(ids)))
  end)

  it("runs any tokenizer template as written, with the variables transformers passes", function()
    local tok = fake_tokenizer(TEMPLATES.other)
    assert.are.equal("[user] hi\\n", chat.render("hi", { tokenizer = tok }))   -- the fixture's \n is text
    local probe = fake_tokenizer("{{ bos_token }}|{{ eos_token }}|{{ tools }}|{{ add_generation_prompt }}|" ..
      "{{ enable_thinking is defined }}|{{ extra }}|{{ messages | length }}", "<s>")
    assert.are.equal("<s>|<|im_end|>|None|True|False||1", chat.render("hi", { tokenizer = probe }))
    assert.are.equal("<s>|<|im_end|>|None|False|True|x|1", chat.render("hi", { tokenizer = probe,
      add_generation_prompt = false, enable_thinking = false, template_args = { extra = "x" } }))
    local ok, err = pcall(chat.render, "hi", { tokenizer = fake_tokenizer("line 1\n{{ x | nosuch }}") })
    assert.is_false(ok)
    assert.matches("line 2: filter 'nosuch' is not supported", err, 1, true)
  end)

  it("puts BOS in exactly once", function()
    -- the tokenizer's own template writes BOS itself: nothing is added (as transformers does)
    local llama = fake_tokenizer(TEMPLATES.llama3, "<|begin_of_text|>")
    local ids, text = chat.encode(llama, "hi")
    assert.are.equal("<|begin_of_text|>", text:sub(1, 17))
    assert.are.same({ string.byte(text, 1, -1) }, ids)
    -- a built-in template whose text starts with BOS gets no second one; other text gets it added
    ids, text = chat.encode(llama, "hi", { template = "llama3" })
    assert.are.equal(("<|begin_of_text|>"):byte(1), ids[1])
    assert.are.same({ string.byte(text, 1, -1) }, ids)
    ids = chat.encode(llama, "hi", { template = "plain" })
    assert.are.same({ 1, string.byte("hi", 1, -1) }, ids)
  end)

  it("names the message, role or template at fault", function()
    assert.has_error(function()
      chat.render({ { role = "user", content = "a" }, { role = "robot", content = "b" } }, { template = "chatml" })
    end, "remax.chat: message 2 has role 'robot' (valid: system, user, assistant, tool)")
    assert.has_error(function()
      chat.render({ { role = "user", content = 5 } }, { template = "chatml" })
    end, "remax.chat: message 1 (user) has content of type number, expected a string")
    local ok, err = pcall(chat.render, "x", { template = "mistral" })
    assert.is_false(ok)
    assert.matches("unknown template 'mistral' (valid: 'chatml', 'llama3', 'plain'", err, 1, true)
    ok, err = pcall(chat.render, "x", { tokenizer = fake_tokenizer(nil) })
    assert.is_false(ok)
    assert.matches("the tokenizer has no chat_template", err, 1, true)
    assert.matches("pass template = 'chatml'", err, 1, true)
    ok, err = pcall(chat.render, "x", { template = "tokenizer", tokenizer = fake_tokenizer(nil) })
    assert.matches("template = 'tokenizer', but the tokenizer has no chat_template", err, 1, true)
    ok, err = pcall(chat.render, "x", {})
    assert.matches("no template given", err, 1, true)
    ok, err = pcall(chat.render, "x", { template = function() return 1 end })
    assert.matches("returned a number, expected a string", err, 1, true)
  end)

  it("names invalid UTF-8 in a tokenizer's template and a template that is a number", function()
    local tok = fake_tokenizer("{{ messages[0].content }}\n{# caf\233 #}")   -- latin-1 e-acute
    tok.chat_template_path = "model/chat_template.jinja"
    local ok, err = pcall(chat.render, "x", { tokenizer = tok })
    assert.is_false(ok)
    assert.matches("model/chat_template.jinja: not valid UTF-8: byte 33 (line 2) is 0xE9", err, 1, true)
    -- the same bytes as UTF-8 render
    assert.are.equal("x\n", chat.render("x", { tokenizer = fake_tokenizer("{{ messages[0].content }}\n{# caf\195\169 #}") }))
    ok, err = pcall(chat.render, "x", { template = 42 })
    assert.matches("unknown template 42 (a number)", err, 1, true)
    local config = require("remax.settings.config")
    ok, err = pcall(config.resolve, { chat_template = 42 })
    assert.matches("chat_template = 42: expected a template name (auto, tokenizer, qa, chatml, llama3, plain: a string)", err, 1, true)
    assert.matches("got a number", err, 1, true)
  end)
end)
