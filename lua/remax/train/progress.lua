-- remax.train.progress moved to remax.run.progress (docs/architecture.md); this name keeps working for a while.
return require("remax.deprecated").moved("remax.train.progress", "remax.run.progress")
