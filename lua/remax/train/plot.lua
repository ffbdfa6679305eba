-- remax.train.plot moved to remax.run.plot (docs/architecture.md); this name keeps working for a while.
return require("remax.deprecated").moved("remax.train.plot", "remax.run.plot")
