-- remax.train.config moved to remax.settings.config (docs/architecture.md); this name keeps working for a while.
return require("remax.deprecated").moved("remax.train.config", "remax.settings.config")
