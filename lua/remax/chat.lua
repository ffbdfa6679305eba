-- remax.chat moved to remax.text.chat (docs/architecture.md); this name keeps working for a while: use require("remax").chat.
return require("remax.deprecated").moved("remax.chat", "remax.text.chat")
