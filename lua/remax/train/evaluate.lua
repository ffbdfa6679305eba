-- remax.train.evaluate moved to remax.step.evaluate (docs/architecture.md); this name keeps working for a while.
return require("remax.deprecated").moved("remax.train.evaluate", "remax.step.evaluate")
