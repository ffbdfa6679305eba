-- Deprecated name, kept for recipes written against earlier docs: use require("remax").data.
return require("remax").deprecated("remax.data", "data")
