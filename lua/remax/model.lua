-- Deprecated name, kept for recipes written against earlier docs: use require("remax").model.
return require("remax").deprecated("remax.model", "model")
