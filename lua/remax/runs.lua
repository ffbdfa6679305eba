-- remax.runs moved to remax.run.folder (docs/architecture.md); this name keeps working for a while: use require("remax").runs.
return require("remax.deprecated").moved("remax.runs", "remax.run.folder")
