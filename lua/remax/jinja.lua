-- Deprecated name, kept for recipes written against earlier docs: use require("remax").jinja.
return require("remax").deprecated("remax.jinja", "jinja")
