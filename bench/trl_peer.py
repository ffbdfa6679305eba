"""The TRL peer of remax (issue 47): TRL's GRPOTrainer, and the seed's ReMaxTrainer rebuilt on it,
training models/tiny-gsm8k on recipes/gsm8k.lua's prompts with a Python port of rewards/gsm8k.lua
(bench/gsm8k_reward.py), for a budget of training time, on the CPU. A benchmark, not a test;
bench/trl_peer.sh runs it beside remax and prints the ratios.

  python bench/trl_peer.py train --algo grpo|remax [--loss-type grpo|dapo] --prompts DIR --minutes M --out FILE.json
  python bench/trl_peer.py rewards --gsm8k DIR --out DIR        # rewards/gsm8k.lua, its port, math-verify

train: DIR holds train.jsonl and test.jsonl from bench/trl_prompts.lua (the recipe's training
prompts in the order a remax run draws them, its held-out split, remax's token ids of each). The
settings are the recipe's wherever TRL has them (32 prompts per step, 4 samples, lr 1e-4 constant,
max_completion_length 320, temperature 1, top_p 1, top_k off, beta 0, one update per rollout,
max_grad_norm 1, AdamW betas (0.9, 0.999), seed 2, no shuffling: the exported order). Held-out
greedy accuracy on the test split is measured every --eval-steps steps and at the start, outside
the training-time budget (as remax's max_time leaves its evaluations out). Writes one JSON file:
per-step times (generate, score, train), tokens, rewards, the evaluations, peak RSS.

--algo remax is the seed PR's ReMax (../shared/seeds/000_*) as a GRPOTrainer subclass (ReMaxTrainer
below): n sampled completions and one greedy completion per prompt in the same generate call,
advantage r(sample) - r(greedy) without std normalisation, the loss a mean over each completion's
tokens, then over the sampled completions (TRL's loss_type "grpo"; the greedy rows are not trained).

rewards: rewards/gsm8k.lua (through remax), its Python port and math-verify on GSM8K's test set
(openai/grade-school-math: test.jsonl's reference solutions, and example_model_solutions.jsonl's
four model solutions per problem with OpenAI's is_correct labels as a fourth opinion), and each
reference answer rewritten the ways models write answers (\\boxed{1,234}, "The final answer is
$N.00", "#### 1,234") and once wrong (their truth by construction, in the same "openai" field).
Prints the agreement and writes every disagreement to DIR/reward_disagreements.jsonl.
"""
import argparse, json, os, resource, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gsm8k_reward import extract_answer, gsm8k_accuracy  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ----------------------------------------------------------------------------------------- training

def budget_callback(TrainerCallback, get_trainer, state, record, args, run_eval, step_extra=None, log_keys=()):
    """The training-time budget a TRL run trains under (bench/trl_peer.py, bench/trl_tools.py): each step timed
    (its generation and scoring as trainer.step_times has them) into record["steps"], an evaluation at the start,
    every args.eval_steps steps and at the end (outside the budget: run_eval keeps its own time), and the stop once
    args.minutes of training have passed. step_extra(times, m) adds a run's own fields to the step's record m and
    returns what its progress line adds; log_keys: (field, TRL log key) pairs kept from TRL's logs."""

    class Budget(TrainerCallback):
        def on_train_begin(self, a, s, control, **kw):
            run_eval(0)

        def on_step_begin(self, a, s, control, **kw):
            get_trainer().step_times = dict(generate=0.0, score=0.0, tokens=0)
            state["t0"] = time.perf_counter()

        def on_step_end(self, a, s, control, **kw):
            step_s = time.perf_counter() - state["t0"]
            state["train_seconds"] += step_s
            t = get_trainer().step_times
            m = dict(step=s.global_step, time_step=step_s, time_generate=t["generate"], time_score=t["score"],
                     time_train=step_s - t["generate"] - t["score"], tokens_generated=t["tokens"],
                     time_elapsed_train=state["train_seconds"], peak_rss_mib=peak_rss_mib())
            note = step_extra(t, m) if step_extra else ""
            record["steps"].append(m)
            print("step %d: %.1f s (generate %.1f, score %.2f, train %.1f), %d tokens generated%s"
                  % (s.global_step, step_s, t["generate"], t["score"], m["time_train"], t["tokens"], note), flush=True)
            over = state["train_seconds"] >= args.minutes * 60
            if s.global_step % args.eval_steps == 0 or over:
                run_eval(s.global_step)
            if over:
                control.should_training_stop = True

        def on_log(self, a, s, control, logs=None, **kw):
            if logs and record["steps"] and "reward" in logs:
                kept = {"reward": logs["reward"], "loss": logs.get("loss"),
                        "completion_length_mean": logs.get("completions/mean_length")}
                for field, key in log_keys:
                    kept[field] = logs.get(key)
                record["steps"][-1].update(kept)

    return Budget()


def train_and_write(trainer, record, state, out):
    """trainer.train(), then the record with its wall, training and evaluation seconds and peak RSS, to out."""
    trainer.step_times = dict(generate=0.0, score=0.0, tokens=0)
    t0 = time.perf_counter()
    trainer.train()
    record.update(wall_seconds=time.perf_counter() - t0, train_seconds=state["train_seconds"],
                  eval_seconds=state["eval_seconds"], peak_rss_mib=peak_rss_mib())
    with open(out, "w") as f:
        json.dump(record, f, indent=1)
    print("wrote %s: %d steps in %.1f training minutes, peak RSS %.0f MiB"
          % (out, len(record["steps"]), state["train_seconds"] / 60, peak_rss_mib()))


def build(args):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessor, LogitsProcessorList, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class Timed(GRPOTrainer):
        """GRPOTrainer with the step's generation and scoring timed (TRL's own profiling reports only to
        wandb/mlflow/trackio), and the rewards of the last rollout kept."""

        def _generate(self, prompts):
            t0 = time.perf_counter()
            out = super()._generate(prompts)
            self.step_times["generate"] += time.perf_counter() - t0
            self.step_times["tokens"] += sum(len(ids) for ids in out[1])
            return out

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            t0 = time.perf_counter()
            rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            self.step_times["score"] += time.perf_counter() - t0
            self.last_rewards = (rewards * self.reward_weights.unsqueeze(0)).nansum(dim=1)
            return rewards

    class GreedyRows(LogitsProcessor):
        """Forces the argmax on every group-th row (the last row of each prompt's group): the greedy
        completion is decoded in the same generate call as the sampled ones."""

        def __init__(self, group):
            self.group = group

        def __call__(self, input_ids, scores):
            rows = torch.arange(scores.shape[0], device=scores.device) % self.group == self.group - 1
            best = scores[rows].argmax(-1, keepdim=True)
            forced = torch.full_like(scores[rows], float("-inf")).scatter_(1, best, 0.0)
            scores[rows] = forced
            return scores

    class ReMaxTrainer(Timed):
        """The seed PR's ReMax on TRL's GRPOTrainer. num_generations = n + 1: each prompt's group of rows
        is n sampled completions and, last, one greedy completion, all in the same generate call
        (GreedyRows, through the model's generate). The advantage of a sample is its reward minus the
        greedy completion's reward, with no std normalisation; the greedy rows leave the batch after
        scoring, so the loss (loss_type "grpo") is a mean over each completion's tokens, then over the
        n sampled completions of every prompt."""

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            if self.accelerator.num_processes != 1:
                raise ValueError("ReMaxTrainer here runs in one process (a prompt's greedy row must be on its rank)")
            self.generate_plain = self.model.generate
            group = self.num_generations

            def generate_with_greedy_row(*args, **kwargs):
                processors = LogitsProcessorList(kwargs.pop("logits_processor", None) or [])
                if self.model.training:   # rollouts: the last row of each group greedy; evaluation as asked
                    processors.append(GreedyRows(group))
                return self.generate_plain(*args, logits_processor=processors, **kwargs)

            self.model.generate = generate_with_greedy_row

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            if not self.model.training:
                return out
            G = self.num_generations
            rewards = self.last_rewards.view(-1, G)
            advantages = (rewards[:, :-1] - rewards[:, -1:]).reshape(-1)   # r(sample) - r(greedy)
            sampled = torch.arange(rewards.numel(), device=rewards.device) % G != G - 1
            for key, value in list(out.items()):
                if torch.is_tensor(value) and value.dim() >= 1 and value.shape[0] == sampled.numel():
                    out[key] = value[sampled]
            out["advantages"] = torch.nan_to_num(advantages, nan=0.0)
            out["num_items_in_batch"] = out["completion_mask"].sum()
            self.step_times["reward_greedy"] = rewards[:, -1].mean().item()
            self.step_times["reward_sampled"] = rewards[:, :-1].mean().item()
            return out

    return torch, AutoModelForCausalLM, AutoTokenizer, TrainerCallback, GRPOConfig, Timed, ReMaxTrainer


def evaluate(torch, model, generate, tok, rows, batch, max_new, eos, pad):
    """Held-out greedy accuracy: remax's token ids of each prompt, left-padded, greedy, stopped at eos."""
    was_training = model.training
    model.eval()
    right, lengths = 0, 0
    with torch.inference_mode():
        for k in range(0, len(rows), batch):
            chunk = rows[k:k + batch]
            width = max(len(r["prompt_ids"]) for r in chunk)
            ids = torch.tensor([[pad] * (width - len(r["prompt_ids"])) + r["prompt_ids"] for r in chunk])
            mask = torch.tensor([[0] * (width - len(r["prompt_ids"])) + [1] * len(r["prompt_ids"]) for r in chunk])
            out = generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new,
                           eos_token_id=eos, pad_token_id=pad, temperature=None, top_p=None, top_k=None)
            texts = tok.batch_decode(out[:, width:], skip_special_tokens=True)
            right += sum(gsm8k_accuracy(texts, final_answer=[r["final_answer"] for r in chunk]))
            lengths += sum(len(tok(t)["input_ids"]) for t in texts)
    if was_training:
        model.train()
    return right / len(rows), lengths / len(rows)


def train(args):
    torch, AutoModelForCausalLM, AutoTokenizer, TrainerCallback, GRPOConfig, Timed, ReMaxTrainer = build(args)
    from datasets import Dataset
    torch.set_num_threads(args.threads)
    train_rows = load_jsonl(os.path.join(args.prompts, "train.jsonl"))
    test_rows = load_jsonl(os.path.join(args.prompts, "test.jsonl"))[:args.eval_size]
    tok = AutoTokenizer.from_pretrained(args.model)
    # the same token ids as remax's for every prompt (TRL tokenizes the prompt text itself)
    for rows in (train_rows[:1024], test_rows):
        bad = [r["prompt"] for r in rows if tok(text=r["prompt"])["input_ids"] != r["prompt_ids"]]
        if bad:
            sys.exit("trl_peer.py: transformers' tokenizer gives other ids than remax's for %d prompts, e.g. %r"
                     % (len(bad), bad[0]))
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    stop = [tok.convert_tokens_to_ids("<|endoftext|>"), tok.convert_tokens_to_ids("<|im_end|>")]   # remax's stop ids
    model.generation_config.eos_token_id = stop
    remax = args.algo == "remax"
    prompts_per_step = args.prompts_per_step
    group = args.num_generations + (1 if remax else 0)
    cfg = GRPOConfig(
        output_dir=args.out + ".trl", report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
        use_cpu=True, bf16=not args.fp32, gradient_checkpointing=args.gradient_checkpointing, seed=args.seed, data_seed=args.seed, shuffle_dataset=False,
        per_device_train_batch_size=prompts_per_step * group, gradient_accumulation_steps=1,
        num_generations=group, max_completion_length=args.max_completion_length,
        temperature=1.0, top_p=1.0, top_k=0, beta=0.0, num_iterations=1,
        loss_type="grpo" if remax else args.loss_type, scale_rewards="none" if remax else "group",
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0,
        max_steps=100000, dataloader_num_workers=0)
    dataset = Dataset.from_list([{"prompt": r["prompt"], "final_answer": r["final_answer"]} for r in train_rows])

    record = dict(side="trl", algo=args.algo, loss_type=cfg.loss_type, bf16=not args.fp32,
                  gradient_checkpointing=args.gradient_checkpointing, minutes=args.minutes,
                  prompts_per_step=prompts_per_step, rows_per_prompt=group, threads=torch.get_num_threads(),
                  torch=torch.__version__, steps=[], evals=[])
    import transformers, trl
    record["versions"] = dict(trl=trl.__version__, transformers=transformers.__version__, torch=torch.__version__)
    state = dict(train_seconds=0.0, eval_seconds=0.0, t0=0.0)

    def gsm8k_accuracy_reward(completions, final_answer, **kwargs):
        return gsm8k_accuracy(completions, final_answer=final_answer)

    cls = ReMaxTrainer if remax else Timed
    trainer = None

    def run_eval(step):
        t0 = time.perf_counter()
        generate = getattr(trainer, "generate_plain", trainer.model.generate)
        acc, length = evaluate(torch, trainer.model, generate, tok, test_rows, args.eval_batch,
                               args.max_completion_length, stop, tok.pad_token_id)
        seconds = time.perf_counter() - t0
        state["eval_seconds"] += seconds
        record["evals"].append(dict(step=step, train_minutes=state["train_seconds"] / 60, accuracy=acc,
                                    completion_length=length, seconds=seconds))
        print("eval at step %d (%.2f training minutes): greedy accuracy %.1f%% (%d prompts, %.0f s)"
              % (step, state["train_seconds"] / 60, 100 * acc, len(test_rows), seconds), flush=True)

    def greedy_rewards(t, m):   # ReMax: the greedy and sampled rows' mean rewards
        for k in ("reward_greedy", "reward_sampled"):
            if k in t:
                m[k] = t[k]
        return ""

    budget = budget_callback(TrainerCallback, lambda: trainer, state, record, args, run_eval, greedy_rewards)
    trainer = cls(model=model, reward_funcs=gsm8k_accuracy_reward, args=cfg, train_dataset=dataset,
                  processing_class=tok, callbacks=[budget])
    train_and_write(trainer, record, state, args.out)


# ------------------------------------------------------------------------------------------ rewards

def reward_cases(gsm8k_dir):
    """(completion, reference answer, where it comes from, OpenAI's is_correct or None) for GSM8K's test set."""
    cases = []
    for i, row in enumerate(load_jsonl(os.path.join(gsm8k_dir, "test.jsonl"))):
        ref = row["answer"].split("####")[-1].strip()
        cases.append(dict(completion=row["answer"], final_answer=ref, source="test.jsonl reference solution",
                          index=i, openai=True))
        # the same right answer written the ways models write it, and a wrong one (the truth by construction)
        body = row["answer"].split("####")[0].rstrip()
        value = float(ref.replace(",", ""))
        commas = "{:,}".format(int(value)) if value == int(value) else ref
        variants = [("boxed, thousands commas", body + "\nSo the answer is $\\boxed{%s}$." % commas, True),
                    ("'The final answer is $N.00'", body + "\nThe final answer is $%s.00" % commas, value == int(value)),
                    ("'#### N' with thousands commas", body + "\n#### " + commas, True),
                    ("'#### N+1' (wrong)", body + "\n#### %s" % (int(value) + 1 if value == int(value) else value + 1), False)]
        for source, text, truth in variants:
            if source.startswith("'The final") and not truth:
                continue   # a non-integer answer has no ".00" form
            cases.append(dict(completion=text, final_answer=ref, source="variant: " + source, index=i, openai=truth))
    solutions = os.path.join(gsm8k_dir, "example_model_solutions.jsonl")
    if os.path.exists(solutions):
        test = load_jsonl(os.path.join(gsm8k_dir, "test.jsonl"))
        for i, row in enumerate(load_jsonl(solutions)):
            ref = test[i]["answer"].split("####")[-1].strip()
            for model in ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification"):
                sol = row.get(model)
                if sol:
                    cases.append(dict(completion=sol["solution"], final_answer=ref, source=model, index=i,
                                      openai=bool(sol["is_correct"])))
    return cases


def rewards(args):
    from math_verify import parse, verify
    cases = reward_cases(args.gsm8k)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "reward_cases.jsonl")
    with open(path, "w") as f:
        for c in cases:
            f.write(json.dumps(dict(completion=c["completion"], final_answer=c["final_answer"])) + "\n")
    lua = subprocess.run([os.path.join(ROOT, "remax"), "run", "bench/reward_check.lua", path], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    lua = [json.loads(line) for line in lua if line.startswith("{")]
    assert len(lua) == len(cases), "bench/reward_check.lua gave %d lines for %d cases" % (len(lua), len(cases))
    t0 = time.perf_counter()
    for c, l in zip(cases, lua):
        c["lua"] = bool(l["score"])
        c["lua_extracted"] = l["extracted"]
        c["py"] = gsm8k_accuracy([c["completion"]], final_answer=[c["final_answer"]])[0] == 1.0
        c["py_extracted"] = extract_answer(c["completion"])[0]
        gold = parse(c["final_answer"])
        pred = parse(c["completion"])
        c["math_verify"] = bool(verify(gold, pred))
        c["math_verify_parsed"] = [str(x) for x in pred]
    mv_seconds = time.perf_counter() - t0
    summary = dict(cases=len(cases), math_verify_seconds=mv_seconds)
    pairs = [("lua", "py"), ("lua", "math_verify"), ("lua", "openai"), ("math_verify", "openai")]
    for a, b in pairs:
        summary["%s_vs_%s_agree" % (a, b)] = sum(c[a] == c[b] for c in cases)
    for who in ("lua", "py", "math_verify", "openai"):
        summary["%s_right" % who] = sum(c[who] for c in cases)
    by_source = {}
    for c in cases:
        s = by_source.setdefault(c["source"], dict(cases=0, lua=0, py=0, math_verify=0, openai=0))
        s["cases"] += 1
        for who in ("lua", "py", "math_verify", "openai"):
            s[who] += c[who]
    summary["by_source"] = by_source
    disagreements = [c for c in cases if len({c["lua"], c["py"], c["math_verify"], c["openai"]}) > 1]
    summary["disagreements"] = len(disagreements)
    with open(os.path.join(args.out, "reward_disagreements.jsonl"), "w") as f:
        for c in disagreements:
            f.write(json.dumps(c) + "\n")
    with open(os.path.join(args.out, "reward_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["train", "rewards"])
    ap.add_argument("--algo", default="grpo", choices=["grpo", "remax"])
    ap.add_argument("--loss-type", default="grpo", help="grpo: remax's seq-mean-token-mean; dapo: TRL's default")
    ap.add_argument("--prompts", default="runs/trl_peer/prompts")
    ap.add_argument("--model", default=os.path.join(ROOT, "models/tiny-gsm8k"))
    ap.add_argument("--minutes", type=float, default=10.0, help="training time (evaluation excluded)")
    ap.add_argument("--prompts-per-step", type=int, default=32)
    ap.add_argument("--num-generations", type=int, default=4, help="sampled completions per prompt")
    ap.add_argument("--max-completion-length", type=int, default=320)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--eval-steps", type=int, default=5)
    ap.add_argument("--eval-size", type=int, default=500)
    ap.add_argument("--eval-batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--fp32", action="store_true",
                    help="fp32 training (default: TRL's default on the CPU, bf16 autocast for the loss's forward and backward)")
    ap.add_argument("--gradient-checkpointing", action="store_true",
                    help="TRL's default; off here: the model is tiny, and recomputing the forward costs time")
    ap.add_argument("--gsm8k", default=os.path.join(ROOT, ".cache/grade-school-math"),
                    help="rewards: a folder with openai/grade-school-math's test.jsonl (and example_model_solutions.jsonl)")
    ap.add_argument("--out", default="runs/trl_peer/trl.json")
    a = ap.parse_args()
    (train if a.mode == "train" else rewards)(a)
