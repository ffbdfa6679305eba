-- Deprecated name, kept for recipes written against earlier docs: use require("remax").optim.
return require("remax").deprecated("remax.optim", "optim")
