"""The guessing game of recipes/guess_number.lua, in Python: an environment class that
recipes/guess_number_py.lua names as environment = "py:guess_number.py:GuessNumber".

remax makes one instance per episode (the greedy episode included), calls reset with the
dataset row's columns by keyword, then step with each assistant turn. docs/environments.md.
"""
import re


class GuessNumber:
    def reset(self, prompt, secret):
        self.secret, self.tries = secret, 0
        return [{"role": "user", "content": prompt}]

    def step(self, text):
        """One assistant turn -> (observation, done, reward)."""
        self.tries += 1
        m = re.search(r"\d", text)
        if not m:
            return "Please answer with one digit.", False, -0.2
        guess = int(m.group(0))
        if guess == self.secret:
            return "Right!", True, 1.0
        return ("Higher." if guess < self.secret else "Lower."), False, -0.1
