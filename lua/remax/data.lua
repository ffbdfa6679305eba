-- remax.data moved to remax.step.data (docs/architecture.md); this name keeps working for a while: use require("remax").data.
return require("remax.deprecated").moved("remax.data", "remax.step.data")
