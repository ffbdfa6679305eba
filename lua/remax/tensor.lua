-- Deprecated name, kept for recipes written against earlier docs: use require("remax").tensor.
return require("remax").deprecated("remax.tensor", "tensor")
