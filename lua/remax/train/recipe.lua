-- remax.train.recipe moved to remax.settings.recipe (docs/architecture.md); this name keeps working for a while.
return require("remax.deprecated").moved("remax.train.recipe", "remax.settings.recipe")
