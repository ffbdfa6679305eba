-- Deprecated name, kept for recipes written against earlier docs: use require("remax").algos.
return require("remax").deprecated("remax.algos", "algos")
