-- Deprecated name, kept for recipes written against earlier docs: use require("remax").tokenizer.
return require("remax").deprecated("remax.tokenizer", "tokenizer")
