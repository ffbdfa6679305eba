-- remax.train.guard moved to remax.step.guard (docs/architecture.md); this name keeps working for a while.
return require("remax.deprecated").moved("remax.train.guard", "remax.step.guard")
