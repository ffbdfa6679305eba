// bench/llamacpp_peer.mjs: llama.cpp through the npm package node-llama-cpp (pinned 3.21.1,
// installed by bench/llamacpp_install.sh into .cache/llamacpp), as the peer of remax's GGUF
// export (tests/lua/gguf_spec.lua) and of its decoding (bench/llamacpp_decode.lua).
//
//   node bench/llamacpp_peer.mjs check REQUEST.json    -> one JSON object on stdout
//   node bench/llamacpp_peer.mjs decode REQUEST.json   -> one JSON object on stdout
//
// check: { jobs: [{ model, threads, rows: [[ids]], texts: [strings], chats: [{messages,
//   add_generation_prompt, vars}], vocab_only }] } -> { results: [{ logprobs: [[[log p over the vocabulary] per position] per row],
//   tokens: [[ids] per text], detokenized: [...], renders: [...], template, metadata, bos, eos,
//   add_bos, vocab_size, arch, tensors, version }] }
// decode: { model, threads, prompts: [[ids]], new, warmup } -> { tokens_per_s, seconds, ... }
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import { resolve } from "node:path";

const home = process.env.REMAX_LLAMACPP_HOME || ".cache/llamacpp";
const entry = resolve(home, "node_modules/node-llama-cpp/dist/index.js");
const { getLlama, readGgufFileInfo } = await import(pathToFileURL(entry).href);

const [mode, requestPath] = process.argv.slice(2);
const request = JSON.parse(readFileSync(requestPath, "utf8"));

const llama = await getLlama({ gpu: false, build: "never", progressLogs: false, logLevel: "error", skipDownload: true });

function now() { return Number(process.hrtime.bigint()) / 1e9; }

async function check(request) {
  const model = await llama.loadModel({ modelPath: request.model, gpuLayers: 0, vocabOnly: !!request.vocab_only });
  const out = { arch: model.fileInfo.metadata.general.architecture, bos: model.tokens.bos, eos: model.tokens.eos,
    add_bos: model.tokens.shouldPrependBosToken, template: model.fileInfo.metadata.tokenizer?.chat_template ?? null };
  // node-llama-cpp's own GGUF reader (independent of remax's) over the file
  const info = await readGgufFileInfo(request.model, { readTensorInfo: true });
  out.tensors = info.fullTensorInfo.map((t) => ({ name: t.name, dims: t.dimensions.map(Number), type: t.ggmlType }));
  out.version = info.version;
  out.tokens = (request.texts || []).map((text) => model.tokenize(text, true));
  out.detokenized = out.tokens.map((ids) => model.detokenize(ids, true));
  // chat templates rendered by llama.cpp's own Jinja engine (the native renderer of the addon)
  out.renders = (request.chats || []).map((chat) => {
    const template = chat.template ?? out.template;
    const renderer = new llama._bindings.AddonJinjaRenderer(template);
    return renderer.render({ messages: chat.messages, add_generation_prompt: chat.add_generation_prompt ?? true,
      bos_token: model.tokens.bosString ?? "", eos_token: model.tokens.eosString ?? "", ...(chat.vars || {}) });
  });
  out.render_tokens = out.renders.map((text) => model.tokenize(text, true));
  if (request.rows && request.rows.length) {
    const width = Math.max(...request.rows.map((r) => r.length));
    const context = await model.createContext({ contextSize: Math.max(64, width + 8), sequences: 1,
      threads: request.threads || 1, batchSize: Math.max(32, width),
      // f32 keys and values and no flash attention: llama.cpp's defaults (an f16 cache; on CPUs,
      // flash attention with f16 products) would round what remax computes in f32
      experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32", flashAttention: false });
    const seq = context.getSequence();
    out.logprobs = [];
    for (const row of request.rows) {
      const input = row.map((t) => [t, { generateNext: { probabilities: true, options: { temperature: 0 } } }]);
      const res = await seq.controlledEvaluate(input);
      const perPos = [];
      for (let i = 0; i < row.length; i++) {
        const probs = res[i].next.probabilities;
        const lp = new Array(probs.size);
        for (const [tok, p] of probs) lp[tok] = Math.log(p);
        perPos.push(lp);
      }
      out.logprobs.push(perPos);
      await seq.clearHistory();
    }
    await context.dispose();
  }
  out.vocab_size = model.tokens ? model.fileInfo.metadata.tokenizer.ggml.tokens.length : null;
  await model.dispose();
  return out;
}

// Greedy decoding of every prompt in one context, one sequence per row: node-llama-cpp batches
// the rows' pending tokens into one llama_decode per step. Each row decodes exactly `new`
// tokens (end-of-generation tokens are yielded and decoding goes on), prefill included in the time.
async function decode() {
  const model = await llama.loadModel({ modelPath: request.model, gpuLayers: 0 });
  const rows = request.prompts.length;
  const width = Math.max(...request.prompts.map((p) => p.length)) + request.new;
  const context = await model.createContext({ contextSize: rows * (width + 16), sequences: rows,
    threads: request.threads, batchSize: Math.min(2048, Math.max(512, rows * request.prompts[0].length)) });
  const sequences = request.prompts.map(() => context.getSequence());
  async function once() {
    let count = 0;
    const t0 = now();
    await Promise.all(request.prompts.map(async (prompt, r) => {
      const seq = sequences[r];
      let n = 0;
      for await (const token of seq.evaluate(prompt, { temperature: 0, yieldEogToken: true })) {
        void token;
        n += 1;
        if (n >= request.new) break;
      }
      count += n;
    }));
    const seconds = now() - t0;
    for (const seq of sequences) await seq.clearHistory();
    return { seconds, count };
  }
  for (let i = 0; i < (request.warmup ?? 1); i++) await once();
  const { seconds, count } = await once();
  const out = { engine: "llama.cpp", package: "node-llama-cpp", rows, prompt: request.prompts[0].length, new: request.new,
    seconds, tokens: count, tokens_per_s: count / seconds, threads: context.currentThreads,
    flash_attention: context.flashAttention, weights: model.fileInfo.metadata.general.file_type,
    llama_cpp: llama.llamaCppRelease?.release ?? null, cpu: llama.systemInfo.trim() };
  await context.dispose();
  await model.dispose();
  return out;
}

let result = null;
if (mode === "check") {
  const results = [];
  for (const job of request.jobs) results.push(await check(job));
  result = { results };
} else if (mode === "decode") {
  result = await decode();
}
if (result === null) {
  process.stderr.write("usage: node bench/llamacpp_peer.mjs check|decode REQUEST.json\n");
  process.exit(2);
}
process.stdout.write(JSON.stringify(result) + "\n");
await llama.dispose();
