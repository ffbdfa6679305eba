-- Deprecated name, kept for recipes written against earlier docs: use require("remax").reward_model.
return require("remax").deprecated("remax.reward_model", "reward_model")
