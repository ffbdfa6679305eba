-- remax.config moved to remax.settings.config (docs/architecture.md); this name keeps working for a while: use require("remax").config.
return require("remax.deprecated").moved("remax.config", "remax.settings.config")
