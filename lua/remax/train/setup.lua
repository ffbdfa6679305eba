-- remax.train.setup moved to remax.run.setup (docs/architecture.md); this name keeps working for a while.
return require("remax.deprecated").moved("remax.train.setup", "remax.run.setup")
