-- Deprecated name, kept for recipes written against earlier docs: use require("remax").trainer.
return require("remax").deprecated("remax.trainer", "trainer")
