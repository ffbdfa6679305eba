-- Deprecated name, kept for recipes written against earlier docs: use require("remax").config.
return require("remax").deprecated("remax.config", "config")
