-- remax.train.resume moved to remax.run.resume (docs/architecture.md); this name keeps working for a while.
return require("remax.deprecated").moved("remax.train.resume", "remax.run.resume")
