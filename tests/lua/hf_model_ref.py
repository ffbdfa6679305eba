"""hf_model_ref.py: transformers and PEFT, in float32 on the CPU, as the reference for the model
folders remax writes (tests/lua/hf_reference_spec.lua).

    python tests/lua/hf_model_ref.py JOBS.json   ->  a JSON list on stdout, one result per job

Each job is an object; "rows" are token-id rows, every one run alone (batch of one, no padding):

  {"kind": "causal", "model": DIR, "adapter": DIR (optional), "rows": [[id, ...], ...]}
      AutoModelForCausalLM.from_pretrained(DIR), then PeftModel.from_pretrained(that, ADAPTER)
      when an adapter is given. Returns
        "logprobs": per row, log p(token_t | tokens_<t) for every t (0 at the first token),
        "next": per row, the log-softmax over the vocabulary after its last token,
        "class": the model's class name, "loading": transformers' missing, unexpected and
        mismatched keys, "lora_modules": how many modules PEFT gave adapters (0 without one).
  {"kind": "seqcls", "model": DIR, "rows": [...]}
      AutoModelForSequenceClassification.from_pretrained(DIR). Returns "scores" (logits[0, 0]
      of each row: transformers pools at the last token that is not config.pad_token_id),
      "class", "loading", "num_labels".
  {"kind": "peft_write", "model": DIR, "out": DIR, "seed": n, "lora": {LoraConfig fields}, "rows": [...]}
      get_peft_model on DIR's causal LM with LoraConfig(**lora, init_lora_weights=False: A and
      B random, so the adapters change the model), save_pretrained(OUT); returns what "causal"
      returns for that PEFT model.
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

torch.set_num_threads(2)


def load(cls, path):
    model, info = cls.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
    loading = {k: sorted(str(x) for x in info.get(k, [])) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    return model.eval(), loading


def lora_count(model):
    return sum(1 for name, _ in model.named_modules() if name.endswith("lora_A"))


@torch.no_grad()
def causal_outputs(model, rows):
    logprobs, nxt = [], []
    for row in rows:
        ids = torch.tensor([row], dtype=torch.long)
        lsm = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
        lp = [0.0] + [lsm[t - 1, row[t]].item() for t in range(1, len(row))]
        logprobs.append(lp)
        nxt.append(lsm[-1].tolist())
    return {"logprobs": logprobs, "next": nxt}


def causal(job):
    model, loading = load(AutoModelForCausalLM, job["model"])
    cls = type(model).__name__
    if job.get("adapter"):
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, job["adapter"]).eval()
    out = causal_outputs(model, job["rows"])
    out.update({"class": cls, "loading": loading, "lora_modules": lora_count(model)})
    return out


@torch.no_grad()
def seqcls(job):
    model, loading = load(AutoModelForSequenceClassification, job["model"])
    scores = [model(input_ids=torch.tensor([row], dtype=torch.long)).logits[0, 0].item() for row in job["rows"]]
    return {"scores": scores, "class": type(model).__name__, "loading": loading, "num_labels": model.config.num_labels}


def peft_write(job):
    from peft import LoraConfig, get_peft_model
    model, loading = load(AutoModelForCausalLM, job["model"])
    torch.manual_seed(job.get("seed", 0))
    model = get_peft_model(model, LoraConfig(init_lora_weights=False, **job["lora"])).eval()
    model.save_pretrained(job["out"])
    out = causal_outputs(model, job["rows"])
    out.update({"class": type(model).__name__, "loading": loading, "lora_modules": lora_count(model)})
    return out


KINDS = {"causal": causal, "seqcls": seqcls, "peft_write": peft_write}


def main(path):
    with open(path) as f:
        jobs = json.load(f)
    json.dump([KINDS[job["kind"]](job) for job in jobs], sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
