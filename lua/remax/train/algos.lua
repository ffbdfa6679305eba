-- remax.train.algos moved to remax.step.algos (docs/architecture.md); this name keeps working for a while.
return require("remax.deprecated").moved("remax.train.algos", "remax.step.algos")
