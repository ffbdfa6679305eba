-- remax.tokenizer moved to remax.bind.tokenizer (docs/architecture.md); this name keeps working for a while: use require("remax").tokenizer.
return require("remax.deprecated").moved("remax.tokenizer", "remax.bind.tokenizer")
