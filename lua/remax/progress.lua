-- remax.progress moved to remax.run.progress (docs/architecture.md); this name keeps working for a while: use require("remax").progress.
return require("remax.deprecated").moved("remax.progress", "remax.run.progress")
