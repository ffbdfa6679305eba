-- remax.safetensors moved to remax.bind.safetensors (docs/architecture.md); this name keeps working for a while: use require("remax").safetensors.
return require("remax.deprecated").moved("remax.safetensors", "remax.bind.safetensors")
