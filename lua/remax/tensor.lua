-- remax.tensor moved to remax.bind.tensor (docs/architecture.md); this name keeps working for a while: use require("remax").tensor.
return require("remax.deprecated").moved("remax.tensor", "remax.bind.tensor")
