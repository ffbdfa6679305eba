-- Deprecated name, kept for recipes written against earlier docs: use require("remax").recipe.
return require("remax").deprecated("remax.recipe", "recipe")
