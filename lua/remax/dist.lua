-- Deprecated name, kept for recipes written against earlier docs: use require("remax").dist.
return require("remax").deprecated("remax.dist", "dist")
