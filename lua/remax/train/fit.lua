-- remax.train.fit moved to remax.step.fit (docs/architecture.md); this name keeps working for a while.
return require("remax.deprecated").moved("remax.train.fit", "remax.step.fit")
