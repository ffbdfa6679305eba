-- remax.train.rewards moved to remax.step.rewards (docs/architecture.md); this name keeps working for a while.
return require("remax.deprecated").moved("remax.train.rewards", "remax.step.rewards")
