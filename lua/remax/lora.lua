-- remax.lora moved to remax.bind.lora (docs/architecture.md); this name keeps working for a while: use require("remax").lora.
return require("remax.deprecated").moved("remax.lora", "remax.bind.lora")
