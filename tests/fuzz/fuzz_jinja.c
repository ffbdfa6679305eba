/* fuzz_jinja.c: libFuzzer target over the chat-template interpreter (lua/remax/text/jinja.lua) in an
 * embedded LuaJIT state, fed both halves of what renders a prompt: the template source and the
 * conversation. The input is the template, then four NUL bytes, then the conversation as JSON:
 * an array is the messages, an object the variables (messages, add_generation_prompt, tools,
 * bos_token, ...); without the separator, or when that part is not JSON, a fixed conversation
 * is used. Any input either renders to a string, or fails with one message naming the template
 * (its line where there is one) -- never a Lua error from inside remax ("attempt to ...", a
 * stack overflow, "not enough memory": remax.text.jinja reports those as "NAME: internal error"),
 * never a crash, a hang or a leak. A conversation that is
 * valid for remax.chat also renders through remax.chat with the template as the tokenizer's
 * chat_template, to the same text.
 * Built by tests/fuzz/run.sh:
 * fuzz-sources: engine/core/error.c engine/cuda/none.c engine/core/tensor.c engine/core/profile.c engine/core/dtype.c engine/core/philox.c
 * fuzz-libs: -I/usr/include/luajit-2.1 -lluajit-5.1 -rdynamic
 * fuzz-dict: jinja.dict
 * fuzz-options: -max_len=65536 -len_control=100 */
#include <stdint.h>
#include "fuzz_lua.h"

static const char CHECK[] =
    "local jinja, chat, cjson = require('remax.text.jinja'), require('remax.text.chat'), require('cjson')\n"
    /* the limits scaled down with the machine: interpreted (the line hook keeps the JIT off)
     * under ASan, a rendering at the default limits takes seconds; these keep one under 1 s */
    "jinja.limits.steps, jinja.limits.bytes, jinja.limits.memory = 20000, 2 ^ 20, 64 * 2 ^ 20\n"
    "local DEFAULT = { { role = 'system', content = 'Be brief.' }, { role = 'user', content = 'Hi \\226\\128\\148 there' },\n"
    "  { role = 'assistant', content = '<think>\\nhm\\n</think>\\n\\nHello.' }, { role = 'user', content = 'Again?' } }\n"
    "local function bad(what, err, name)\n"
    "  if type(err) ~= 'string' then return what .. ': the error is a ' .. type(err) end\n"
    "  if err:sub(1, #name) ~= name then return what .. ': error without the template name: ' .. err end\n"
    /* the interpreter's own faults (a Lua error, a stack overflow, memory) say so after the name;
     * a template's error may quote its source, which may hold any text */
    "  if err:sub(#name + 1, #name + 16) == ': internal error' then return what .. ': ' .. err end\n"
    "  if not err:find('^' .. name:gsub('%.', '%%.') .. ' line %d+: ') and not err:find('^' .. name:gsub('%.', '%%.') .. ': ') then\n"
    "    return what .. ': an error of another form: ' .. err\n"
    "  end\n"
    "end\n"
    "return function(path)\n"
    "  local f = assert(io.open(path, 'rb'))\n"
    "  local input = f:read('*a')\n"
    "  f:close()\n"
    "  local cut = input:find('\\0\\0\\0\\0', 1, true)\n"
    "  local src = cut and input:sub(1, cut - 1) or input\n"
    "  local vars = { messages = DEFAULT, add_generation_prompt = true, bos_token = '<s>', eos_token = '</s>' }\n"
    "  if cut then\n"
    "    local ok, v = pcall(cjson.decode, input:sub(cut + 4))\n"
    "    if ok and type(v) == 'table' then\n"
    "      if #v > 0 or next(v) == nil then vars.messages = v else vars = v end\n"
    "    end\n"
    "  end\n"
    "  local name = 'chat_template.jinja'\n"
    "  local ok, tpl = pcall(jinja.compile, src, name)\n"
    "  if not ok then return bad('compile', tpl, name) end\n"
    "  local ok2, text = pcall(tpl.render, tpl, vars)\n"
    "  if not ok2 then return bad('render', text, name) end\n"
    "  if type(text) ~= 'string' then return 'render returned a ' .. type(text) end\n"
    "  local messages = vars.messages\n"
    "  if src ~= '' and chat.check_messages(messages) then\n"
    "    local tok = { chat_template = src, chat_template_path = name, special_tokens = { bos_token = '<s>', eos_token = '</s>' } }\n"
    "    local ok3, text3 = pcall(chat.render, messages, { tokenizer = tok, add_generation_prompt = true })\n"
    "    if not ok3 then return bad('chat.render', text3, name) end\n"
    "    local same = { messages = messages, add_generation_prompt = true, tools = jinja.none, documents = jinja.none,\n"
    "      bos_token = '<s>', eos_token = '</s>' }\n"
    "    local ok4, text4 = pcall(tpl.render, tpl, same)\n"
    "    if not ok4 then return bad('render', text4, name) end\n"
    "    if text3 ~= text4 and not src:find('strftime_now', 1, true) then return 'remax.chat renders it differently' end\n"
    "  end\n"
    "end\n";

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc; (void)argv;
  /* The interpreter runs with the JIT off under a line hook here, and each input renders up to
   * four times: a template at jinja's own limits ({{range(100000)}}, jinja2's sandbox limit) costs
   * about a second of CPU that way and 20 ms in remax. 3 s keeps slow-input findings to real
   * blow-ups. */
  setenv("FUZZ_CPU_LIMIT", "3", 0);
  fuzz_lua_init(CHECK);
  fuzz_lua_cover("remax/text/jinja.lua");   /* the chunk name of lua/remax/text/jinja.lua */
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_lua_input("chat_template.jinja", data, size); }
