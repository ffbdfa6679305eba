"""The calculator demonstration under TRL (issue 47 item 5): TRL's GRPOTrainer with tools=[calculator] on
models/tiny-gsm8k-tools, recipes/gsm8k_tools.lua's prompts and settings, for a budget of training time, on
the CPU. A benchmark, not a test; bench/trl_peer.sh runs it (RUNS="... trl:tools-grpo") beside
recipes/gsm8k_tools.lua and prints the ratios.

  python bench/trl_tools.py --prompts DIR --minutes M --out FILE.json

DIR holds train.jsonl and test.jsonl from `bench/trl_prompts.lua --recipe recipes/gsm8k_tools.lua`: each
row's messages (the system message and the question), remax's token ids of its rendered prompt, and the
answer.

What the model needs before TRL's tool loop runs on it, as a TRL user would write it:
- A chat template. models/tiny-gsm8k-tools was taught remax.tasks.gsm8k_tools's qa format, which has no
  Jinja template; QA_CHAT_TEMPLATE below renders it, and the prompt ids are checked against remax's.
- A response template. TRL parses tool calls with transformers' `parse_response`, whose templates TRL
  knows only for a few chat templates (Qwen, Llama 3, GLM, GPT-OSS); QA_RESPONSE_TEMPLATE reads the
  format's <tool_call>{json}</tool_call>.
- A stop after the call. TRL's loop ends a turn at an end-of-sequence token and then appends the tool
  result as rendered by the chat template. This format has no end-of-turn token (a turn ends where its
  call closes, the recipe's stop string "</tool_call>"), so generate is given that stop string (the
  model's generate wrapped to pass it and the tokenizer, as transformers asks), and the padding after
  a stopped row is cut from the completion (ToolsTrainer._generate_single_turn). Without that cut TRL
  keeps the padding as completion tokens, since its mask runs to the first end-of-sequence token.

The settings are the recipe's wherever TRL has them: 32 prompts per step, 4 samples, lr 1e-4
constant, max_completion_length 320, temperature 1, beta 0, max_tool_calling_iterations 3 (the
recipe's max_turns 4: TRL's alias), seed 2, the exported order. Differences that remain: TRL's
max_completion_length counts the tool results' tokens too (remax's counts the model's), and a
failing call's result is TRL's {'error': ...} text (remax's "Error: ...").

The held-out accuracy is measured the way remax's recipe measures it (remax.tasks.gsm8k_tools's
held_out): a greedy episode per held-out prompt (greedy in every turn, the same calculator, up to 4
turns), its accuracy, and how many episodes call the calculator and use it correctly, outside the
training-time budget. There is no TRL ReMax here: its greedy row is forced by row position in the one
generate call (bench/trl_peer.py), and TRL's tool loop calls generate again on the subset of rows that
called a tool, where the position no longer says which row is greedy.
"""
import argparse, json, os, re, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gsm8k_reward import gsm8k_accuracy  # noqa: E402
from trl_peer import ROOT, budget_callback, build, load_jsonl, train_and_write  # noqa: E402

STOP = "</tool_call>"
MAX_TURNS = 4

# remax.tasks.gsm8k_tools's template: "SYSTEM\nQuestion: Q\nAnswer: <tool_call>{...}</tool_call>\nResult: R\nAnswer: ".
# An assistant message that calls a tool ends where the call closes; the tool's message brings the line break.
QA_CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}{{ m.content }}{{ '\\n' }}"
    "{%- elif m.role == 'user' -%}{{ 'Question: ' }}{{ m.content }}{{ '\\n' }}"
    "{%- elif m.role == 'assistant' -%}{{ 'Answer: ' }}{{ m.content or '' }}"
    "{%- for tc in m.tool_calls or [] -%}"
    "{{ '<tool_call>' }}{{ {'name': tc.function.name, 'arguments': tc.function.arguments} | tojson }}{{ '</tool_call>' }}"
    "{%- endfor -%}"
    "{%- if not m.tool_calls -%}{{ '\\n' }}{%- endif -%}"
    "{%- elif m.role == 'tool' -%}{{ '\\nResult: ' }}{{ m.content }}{{ '\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ 'Answer: ' }}{%- endif -%}"
)

# transformers' response template for it: the message starts after the prompt's last "Answer: ", tool calls are
# <tool_call>{json}</tool_call>, text runs to the end of sequence.
QA_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "Answer: ",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|endoftext\|>\s*", "content": "text"},
    },
}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses

    Args:
        expression: the arithmetic expression
    """
    # remax.tasks.gsm8k_tools.calculate, in Python: the same characters, results and refusals
    if not re.fullmatch(r"[\d\s.+\-*/()]+", expression) or "**" in expression or "//" in expression:
        raise ValueError("only numbers and + - * / ( ) are allowed")
    try:
        v = eval(expression, {"__builtins__": {}}, {})  # noqa: S307 (digits, spaces, . + - * / ( ) only)
    except ZeroDivisionError:
        raise ValueError("no number")
    except SyntaxError:
        raise ValueError("cannot read " + expression)
    v = float(v)
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError("no number")
    return "%d" % v if v == int(v) else "%.6g" % v


def tool_use(messages):
    """remax.tasks.gsm8k_tools.tool_use_of: calls, failed calls, and correct use (at least one call, every call
    answered, the final "#### N" is the last result)."""
    calls, errors, last, answer = 0, 0, None, None
    for m in messages:
        if m.get("role") == "tool":
            calls += 1
            try:
                last = float(m["content"])
            except (TypeError, ValueError):
                errors += 1
        elif m.get("role") == "assistant":
            answer = m.get("content") or ""
    finals = re.findall(r"####\s*(-?[\d.]+)", answer or "")
    final = None
    if finals:
        try:
            final = float(finals[-1])
        except ValueError:
            pass
    correct = calls > 0 and errors == 0 and last is not None and final is not None \
        and abs(final - last) <= 1e-6 * max(1, abs(last))
    return calls, errors, correct


def answer_text(messages):
    """The text the reward reads: the assistant messages of the episode, in order."""
    return "\n".join(m.get("content") or "" for m in messages if m.get("role") == "assistant")


def cut_at_stop(ids, stop_ids):
    """ids up to and including the first occurrence of stop_ids, or ids."""
    n = len(stop_ids)
    for i in range(n, len(ids) + 1):
        if ids[i - n:i] == stop_ids:
            return ids[:i]
    return ids


def episodes(torch, model, generate, tok, rows, batch, max_tokens, stop_ids, eos, pad):
    """Greedy episodes with the calculator, remax.tasks.gsm8k_tools.held_out's way: each turn generated greedily
    until the end of sequence or the call's close; a call is run and its result appended ("\\nResult: R\\nAnswer: ");
    at most MAX_TURNS turns, max_tokens of the model's tokens in all. Returns per-row (accuracy, calls, correct)."""
    out = []
    for k in range(0, len(rows), batch):
        chunk = rows[k:k + batch]
        ctx = [list(r["prompt_ids"]) for r in chunk]
        msgs = [[] for _ in chunk]
        used = [0] * len(chunk)
        live = list(range(len(chunk)))
        for turn in range(MAX_TURNS):
            if not live:
                break
            width = max(len(ctx[i]) for i in live)
            ids = torch.tensor([[pad] * (width - len(ctx[i])) + ctx[i] for i in live])
            mask = torch.tensor([[0] * (width - len(ctx[i])) + [1] * len(ctx[i]) for i in live])
            budget = max(1, max_tokens - min(used[i] for i in live))
            gen = generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=budget,
                           eos_token_id=eos, pad_token_id=pad, temperature=None, top_p=None, top_k=None,
                           stop_strings=[STOP], tokenizer=tok)[:, width:].tolist()
            still = []
            for j, i in enumerate(live):
                g = gen[j]
                cut = len(g)
                for p, t in enumerate(g):
                    if t in eos or t == pad:
                        cut = p
                        break
                g = cut_at_stop(g[:cut], stop_ids)[:max_tokens - used[i]]
                used[i] += len(g)
                text = tok.decode(g, skip_special_tokens=True)
                call = re.fullmatch(r"(?s)(.*?)<tool_call>(.*)</tool_call>", text)
                if call and turn < MAX_TURNS - 1 and used[i] < max_tokens:
                    msgs[i].append({"role": "assistant", "content": call.group(1)})
                    try:
                        c = json.loads(call.group(2))
                        result = calculator(**c["arguments"]) if c.get("name") == "calculator" else "Error: unknown tool"
                    except Exception as e:  # noqa: BLE001 (any failure is the episode's error message)
                        result = "Error: %s" % e
                    msgs[i].append({"role": "tool", "content": result})
                    ctx[i] = ctx[i] + g + tok("\nResult: %s\nAnswer: " % result)["input_ids"]
                    still.append(i)
                else:
                    msgs[i].append({"role": "assistant", "content": text})
            live = still
        for r, m in zip(chunk, msgs):
            acc = gsm8k_accuracy([answer_text(m)], final_answer=[r["final_answer"]])[0]
            calls, _, correct = tool_use(m)
            out.append((acc, calls > 0, correct))
    return out


def train(args):
    torch, AutoModelForCausalLM, AutoTokenizer, TrainerCallback, GRPOConfig, Timed, _ = build(args)
    from datasets import Dataset
    torch.set_num_threads(args.threads)
    train_rows = load_jsonl(os.path.join(args.prompts, "train.jsonl"))
    test_rows = load_jsonl(os.path.join(args.prompts, "test.jsonl"))[:args.eval_size]
    tok = AutoTokenizer.from_pretrained(args.model)
    tok.chat_template = QA_CHAT_TEMPLATE
    tok.response_template = QA_RESPONSE_TEMPLATE
    for rows in (train_rows[:1024], test_rows):
        for r in rows:
            ids = tok.apply_chat_template(r["messages"], tools=[calculator], add_generation_prompt=True,
                                          tokenize=True, return_dict=False)
            if ids != r["prompt_ids"]:
                sys.exit("trl_tools.py: the chat template gives other ids than remax's for %r:\n%r\n%r"
                         % (r["messages"], tok.decode(ids), r["prompt"]))
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    eos = [tok.convert_tokens_to_ids("<|endoftext|>"), tok.convert_tokens_to_ids("<|im_end|>")]   # remax's stop ids
    model.generation_config.eos_token_id = eos
    stop_ids = tok(STOP)["input_ids"]
    pad = tok.pad_token_id

    class ToolsTrainer(Timed):
        """GRPOTrainer with the turn's stop after a call (see the module's notes) and the model's tokens counted."""

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.generate_plain = self.model.generate
            self.shown = False

            def generate_with_stop(*args, **kwargs):
                kwargs.setdefault("stop_strings", [STOP])
                kwargs.setdefault("tokenizer", tok)
                return self.generate_plain(*args, **kwargs)

            self.model.generate = generate_with_stop

        def _generate_single_turn(self, *a, **k):
            completion_ids, logprobs = super()._generate_single_turn(*a, **k)
            cut = []
            for ids in completion_ids:
                c = cut_at_stop(ids, stop_ids)
                if len(c) < len(ids) and any(t not in (pad, *eos) for t in ids[len(c):]):
                    raise RuntimeError("trl_tools.py: tokens after the stop string that are not padding: %r" % ids)
                cut.append(c)
            return cut, logprobs

        def _generate(self, prompts):
            t0 = time.perf_counter()
            out = super(Timed, self)._generate(prompts)
            self.step_times["generate"] += time.perf_counter() - t0
            tool_mask = out[2]
            self.step_times["tokens"] += sum(sum(m) for m in tool_mask) if tool_mask is not None \
                else sum(len(ids) for ids in out[1])
            self.step_times["tool_use"] = [tool_use(c) for c in out[3]]
            if args.show and not self.shown:   # the first episode with a call, as the model saw it
                for ids, c in zip(out[1], out[3]):
                    if any(m.get("role") == "tool" for m in c):
                        print("an episode with a call (completion ids decoded):\n" + tok.decode(ids), flush=True)
                        self.shown = True
                        break
            return out

    cfg = GRPOConfig(
        output_dir=args.out + ".trl", report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
        use_cpu=True, bf16=not args.fp32, gradient_checkpointing=False, seed=args.seed, data_seed=args.seed,
        shuffle_dataset=False, per_device_train_batch_size=args.prompts_per_step * args.num_generations,
        gradient_accumulation_steps=1, num_generations=args.num_generations,
        max_completion_length=args.max_completion_length, max_tool_calling_iterations=MAX_TURNS - 1,
        temperature=1.0, top_p=1.0, top_k=0, beta=0.0, num_iterations=1, loss_type=args.loss_type,
        scale_rewards="group", learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0, max_steps=100000,
        dataloader_num_workers=0)
    dataset = Dataset.from_list([{"prompt": r["messages"], "final_answer": r["final_answer"]} for r in train_rows])
    import transformers, trl
    record = dict(side="trl", algo="tools-grpo", loss_type=cfg.loss_type, bf16=not args.fp32, minutes=args.minutes,
                  prompts_per_step=args.prompts_per_step, rows_per_prompt=args.num_generations,
                  threads=torch.get_num_threads(), eval_size=len(test_rows), steps=[], evals=[],
                  versions=dict(trl=trl.__version__, transformers=transformers.__version__, torch=torch.__version__))
    state = dict(train_seconds=0.0, eval_seconds=0.0, t0=0.0)

    def gsm8k_accuracy_reward(completions, final_answer, **kwargs):
        return gsm8k_accuracy([answer_text(c) for c in completions], final_answer=final_answer)

    trainer = None

    def run_eval(step):
        t0 = time.perf_counter()
        was_training = trainer.model.training
        trainer.model.eval()
        with torch.inference_mode():
            res = episodes(torch, trainer.model, trainer.generate_plain, tok, test_rows, args.eval_batch,
                           args.max_completion_length, stop_ids, eos, pad)
        if was_training:
            trainer.model.train()
        n = len(res)
        e = dict(step=step, train_minutes=state["train_seconds"] / 60, accuracy=sum(r[0] for r in res) / n,
                 tool_calls=sum(r[1] for r in res) / n, tool_correct=sum(r[2] for r in res) / n,
                 seconds=time.perf_counter() - t0)
        state["eval_seconds"] += e["seconds"]
        record["evals"].append(e)
        print("eval at step %d (%.2f training minutes): greedy accuracy %.1f%%, calls the calculator %.1f%%, "
              "correct tool use %.1f%% (%d prompts, %.0f s)" % (step, e["train_minutes"], 100 * e["accuracy"],
                                                                100 * e["tool_calls"], 100 * e["tool_correct"], n,
                                                                e["seconds"]), flush=True)

    def tool_use_share(t, m):   # the share of the step's episodes that call the calculator, and use it right
        uses = t.get("tool_use") or []
        m["tool_calls"] = sum(u[0] > 0 for u in uses) / max(1, len(uses))
        m["tool_correct"] = sum(u[2] for u in uses) / max(1, len(uses))
        return ", %.0f%% call the calculator" % (100 * m["tool_calls"])

    budget = budget_callback(TrainerCallback, lambda: trainer, state, record, args, run_eval, tool_use_share,
                             (("tools_call_frequency", "tools/call_frequency"),
                              ("tools_failure_frequency", "tools/failure_frequency")))
    trainer = ToolsTrainer(model=model, reward_funcs=gsm8k_accuracy_reward, args=cfg, train_dataset=dataset,
                           processing_class=tok, tools=[calculator], callbacks=[budget])
    train_and_write(trainer, record, state, args.out)

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", default="runs/trl_peer/tools-prompts")
    ap.add_argument("--model", default=os.path.join(ROOT, "models/tiny-gsm8k-tools"))
    ap.add_argument("--minutes", type=float, default=10.0, help="training time (evaluation excluded)")
    ap.add_argument("--prompts-per-step", type=int, default=32)
    ap.add_argument("--num-generations", type=int, default=4)
    ap.add_argument("--max-completion-length", type=int, default=320)
    ap.add_argument("--loss-type", default="grpo", help="grpo: remax's seq-mean-token-mean; dapo: TRL's default")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--eval-steps", type=int, default=5)
    ap.add_argument("--eval-size", type=int, default=300)
    ap.add_argument("--eval-batch", type=int, default=150)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--fp32", action="store_true", help="fp32 training (default: bf16 autocast, as bench/trl_peer.py)")
    ap.add_argument("--show", action="store_true", help="print the first training episode that calls the calculator")
    ap.add_argument("--out", default="runs/trl_peer/trl-tools-grpo.json")
    train(ap.parse_args())
