-- remax.train.schema moved to remax.settings.schema (docs/architecture.md); this name keeps working for a while.
return require("remax.deprecated").moved("remax.train.schema", "remax.settings.schema")
