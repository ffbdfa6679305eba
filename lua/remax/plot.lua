-- Deprecated name, kept for recipes written against earlier docs: use require("remax").plot.
return require("remax").deprecated("remax.plot", "plot")
