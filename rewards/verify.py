"""rewards/verify.py: a GSM8K answer check written in Python, as a TRL reward function.

Use it in a recipe as  rewards = { "py:rewards/verify.py" }  (remax runs this file in one
long-lived python3 worker per run; see docs/rewards.md). The function has TRL's signature:
completions, the prompts, and every dataset column as a keyword argument, each a list aligned
with completions. It returns one score per completion (None = no score). Standard library only.
"""
import re
from fractions import Fraction

_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def _value(text):
    """The number a string ends its answer with: after the last '####', else the last number."""
    if text is None:
        return None
    tail = text.rsplit("####", 1)[-1] if "####" in text else text
    found = _NUMBER.findall(tail)
    if not found:
        return None
    s = found[0] if "####" in text else found[-1]
    s = s.replace("$", "").replace(",", "")
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def reward(completions, final_answer=None, answer=None, **kwargs):
    """1.0 when the completion's final number equals the reference's, else 0.0."""
    refs = final_answer if final_answer is not None else answer
    if refs is None:
        raise KeyError("verify.py needs a final_answer or answer column")
    scores = []
    for completion, ref in zip(completions, refs):
        want, got = _value(str(ref)), _value(completion)
        scores.append(1.0 if want is not None and got == want else 0.0)
    return scores
