-- Deprecated name, kept for recipes written against earlier docs: use require("remax").gguf.
return require("remax").deprecated("remax.gguf", "gguf")
