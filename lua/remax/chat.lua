-- Deprecated name, kept for recipes written against earlier docs: use require("remax").chat.
return require("remax").deprecated("remax.chat", "chat")
