-- Deprecated name, kept for recipes written against earlier docs: use require("remax").progress.
return require("remax").deprecated("remax.progress", "progress")
