-- remax.train.runs moved to remax.run.folder (docs/architecture.md); this name keeps working for a while.
return require("remax.deprecated").moved("remax.train.runs", "remax.run.folder")
