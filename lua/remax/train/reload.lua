-- remax.train.reload moved to remax.run.reload (docs/architecture.md); this name keeps working for a while.
return require("remax.deprecated").moved("remax.train.reload", "remax.run.reload")
