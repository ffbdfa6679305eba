-- remax.train.data moved to remax.step.data (docs/architecture.md); this name keeps working for a while.
return require("remax.deprecated").moved("remax.train.data", "remax.step.data")
