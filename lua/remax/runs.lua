-- Deprecated name, kept for recipes written against earlier docs: use require("remax").runs.
return require("remax").deprecated("remax.runs", "runs")
