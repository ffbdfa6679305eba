-- Deprecated name, kept for recipes written against earlier docs: use require("remax").lora.
return require("remax").deprecated("remax.lora", "lora")
