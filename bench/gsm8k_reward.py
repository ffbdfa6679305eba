"""A Python port of rewards/gsm8k.lua (gsm8k_accuracy), for the TRL peer (bench/trl_peer.py):
1 when a completion's final answer equals the reference by value, else 0.

The completion's answer is, in order of preference: the number after the last "####", the number
in the last \\boxed{...}, the number after the last "answer is" / "answer:", else the last number.
The port works on the UTF-8 bytes, as Lua's string functions do (ASCII classes, byte-wise
lower()), so both sides find the same numbers at the same places.

    from gsm8k_reward import gsm8k_accuracy, extract_answer
    gsm8k_accuracy(["... #### 72"], final_answer=["72"])   # -> [1.0]
"""
import math
import re

_SPACE = b" \t\n\v\f\r"
_DIGITS = re.compile(rb"[0-9]+")
_GROUP = re.compile(rb",[0-9]{3}")
_GROUP4 = re.compile(rb",[0-9]{4}")
_FRAC = re.compile(rb"\.[0-9]+")
_DEN = re.compile(rb"/([0-9]+)")


def _at(text, i):
    return text[i:i + 1]


def _is_digit(c):
    return len(c) == 1 and 48 <= c[0] <= 57


def number_at(text, i):
    """The number token starting at byte i (without "$"), and its last index; or (None, None)."""
    j, sign = i, b""
    c = _at(text, j)
    if c in (b"-", b"+") and c:
        sign = b"-" if c == b"-" else b""
        j += 1
    if _at(text, j) == b"$":
        j += 1
    m = _DIGITS.match(text, j)
    body = b""
    if m:
        body, j = m.group(), m.end()
        while _GROUP.match(text, j) and not _GROUP4.match(text, j):   # thousands groups
            body += text[j:j + 4]
            j += 4
    frac = _FRAC.match(text, j)
    if frac:
        body, j = body + frac.group(), frac.end()
    if body == b"":
        return None, None
    if m and not frac:
        den = _DEN.match(text, j)
        if den:
            body, j = body + b"/" + den.group(1), den.end()
    if _at(text, j) == b"%":
        body, j = body + b"%", j + 1
    return sign + body, j - 1


def can_start(text, i):
    c = _at(text, i)
    if _is_digit(c):
        return True
    nxt = _at(text, i + 1)
    if c == b".":
        return _is_digit(nxt)
    if c in (b"-", b"+") and c:
        prev = text[i - 1:i] if i > 0 else b""
        if prev and (prev.isalnum() or prev == b")"):
            return False
        return _is_digit(nxt) or nxt in (b".", b"$")
    if c == b"$":
        return _is_digit(nxt)
    return False


def numbers(text):
    """Every number token of text: [(token, first, last)]."""
    out, i = [], 0
    while i < len(text):
        tok = None
        if can_start(text, i):
            tok, last = number_at(text, i)
        if tok is not None:
            out.append((tok, i, last))
            i = last + 1
        else:
            i += 1
    return out


def _to_bytes(s):
    return s.encode("utf-8") if isinstance(s, str) else s


def parse_number(s):
    """The value of a string that is one number ("$1,234", "-3.5", "3/4", "50%"), or None."""
    if isinstance(s, (int, float)) and not isinstance(s, bool):
        return float(s)
    if not isinstance(s, (str, bytes)):
        return None
    s = _to_bytes(s).strip(_SPACE)
    tok, last = number_at(s, 0)
    if tok is None or last != len(s) - 1:
        return None
    tok = tok.replace(b",", b"")
    if tok.endswith(b"%"):
        tok = tok[:-1]
    m = re.fullmatch(rb"(-?[0-9]+)/([0-9]+)", tok)
    if m:
        if int(m.group(2)) == 0:
            return None
        return float(m.group(1)) / float(m.group(2))
    return float(tok)


def first_number(text):
    n = numbers(text)
    return n[0][0] if n else None


def last_boxed(text):
    """The content of the last \\boxed{...} (balanced braces), LaTeX number notation simplified."""
    start = None
    for m in re.finditer(rb"\\boxed\s*\{", text):
        start = m.end()
    if start is None:
        return None
    depth, j = 1, start
    while j < len(text) and depth > 0:
        c = text[j:j + 1]
        if c == b"{":
            depth += 1
        elif c == b"}":
            depth -= 1
        j += 1
    inner = text[start:j - 1]
    inner = re.sub(rb"\\[dt]?frac\s*\{\s*(-?[0-9.]+)\s*\}\s*\{\s*([0-9.]+)\s*\}", rb"\1/\2", inner)
    inner = inner.replace(b"{,}", b",")
    inner = re.sub(rb"\\[,!]", b"", inner)
    return inner.replace(b"\\%", b"%").replace(b"\\$", b"$")


def after_answer_phrase(text):
    """The number following the last "answer is" / "answer:" (optional "final", "$", "**")."""
    lower = text.lower()   # bytes: ASCII only, as Lua's
    found, start = None, 0
    while True:
        s = lower.find(b"answer", start)
        if s < 0:
            break
        e = s + len(b"answer")   # one past the phrase
        start = e
        j = e
        for pattern in (rb"[\s*]*", rb"is", rb"[\s*]*", rb":", rb"[\s*]*", rb"\\?\$?", rb"[\s*]*"):
            m = re.compile(pattern).match(lower, j)
            if m:
                j = m.end()
        if j > e and can_start(text, j):
            tok, _ = number_at(text, j)
            if tok is not None:
                found = tok
    return found


def extract_answer(text):
    """(the final answer as a number string, the form it was found in) or (None, None)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return str(text), "number"
    if not isinstance(text, (str, bytes)):
        return None, None
    text = _to_bytes(text)
    k = text.rfind(b"####")
    if k >= 0:
        n = first_number(text[k + 4:])
        if n is not None:
            return n.decode(), "####"
    boxed = last_boxed(text)
    if boxed is not None:
        n = first_number(boxed)
        if n is not None:
            return n.decode(), "boxed"
    n = after_answer_phrase(text)
    if n is not None:
        return n.decode(), "answer_is"
    everything = numbers(text)
    if everything:
        return everything[-1][0].decode(), "last_number"
    return None, None


def _is_integer(x):
    return math.isinf(x) or x == math.floor(x)


def same_value(a, b, tolerance=1e-6):
    x, y = parse_number(a), parse_number(b)
    if x is None or y is None:
        return False
    if _is_integer(x) and _is_integer(y):   # two integers: exactly equal (1450001 is not 1450000)
        return x == y
    return abs(x - y) <= tolerance * max(1.0, abs(x), abs(y))


def gsm8k_accuracy(completions, final_answer=None, answer=None, **kwargs):
    """TRL's reward-function signature: 1.0 or 0.0 per completion (a string, or TRL's conversational
    [{"role": "assistant", "content": ...}]). The reference is final_answer[i], else the answer
    extracted from answer[i] (GSM8K's "... #### 72")."""
    refs = final_answer if final_answer is not None else [extract_answer(a)[0] for a in answer]
    scores = []
    for completion, ref in zip(completions, refs):
        if isinstance(completion, list):
            completion = completion[-1]["content"]
        if parse_number(ref) is None:
            raise ValueError("gsm8k_accuracy: reference answer %r is not a number" % (ref,))
        got, _ = extract_answer(completion)
        scores.append(1.0 if got is not None and same_value(got, ref) else 0.0)
    return scores
