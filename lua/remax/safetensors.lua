-- Deprecated name, kept for recipes written against earlier docs: use require("remax").safetensors.
return require("remax").deprecated("remax.safetensors", "safetensors")
