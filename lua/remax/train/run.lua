-- remax.train.run moved to remax.run.run (docs/architecture.md); this name keeps working for a while.
return require("remax.deprecated").moved("remax.train.run", "remax.run.run")
