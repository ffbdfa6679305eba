-- remax.train.report moved to remax.run.report (docs/architecture.md); this name keeps working for a while.
return require("remax.deprecated").moved("remax.train.report", "remax.run.report")
