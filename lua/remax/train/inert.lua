-- remax.train.inert moved to remax.settings.inert (docs/architecture.md); this name keeps working for a while.
return require("remax.deprecated").moved("remax.train.inert", "remax.settings.inert")
