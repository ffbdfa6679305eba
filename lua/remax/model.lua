-- remax.model moved to remax.bind.model (docs/architecture.md); this name keeps working for a while: use require("remax").model.
return require("remax.deprecated").moved("remax.model", "remax.bind.model")
