-- Deprecated name, kept for recipes written against earlier docs: use require("remax").rewards.
return require("remax").deprecated("remax.rewards", "rewards")
