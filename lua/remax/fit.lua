-- remax.fit moved to remax.step.fit (docs/architecture.md); this name keeps working for a while: use require("remax").fit.
return require("remax.deprecated").moved("remax.fit", "remax.step.fit")
