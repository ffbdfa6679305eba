-- remax.algos moved to remax.step.algos (docs/architecture.md); this name keeps working for a while: use require("remax").algos.
return require("remax.deprecated").moved("remax.algos", "remax.step.algos")
