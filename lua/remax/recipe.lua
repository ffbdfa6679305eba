-- remax.recipe moved to remax.settings.recipe (docs/architecture.md); this name keeps working for a while: use require("remax").recipe.
return require("remax.deprecated").moved("remax.recipe", "remax.settings.recipe")
