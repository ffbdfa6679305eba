-- remax.trainer moved to remax.run.run (docs/architecture.md); this name keeps working for a while: use require("remax").trainer.
return require("remax.deprecated").moved("remax.trainer", "remax.run.run")
