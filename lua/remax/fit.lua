-- Deprecated name, kept for recipes written against earlier docs: use require("remax").fit.
return require("remax").deprecated("remax.fit", "fit")
