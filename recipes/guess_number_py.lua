-- guess_number_py: recipes/guess_number.lua with its game written in Python
-- (recipes/guess_number.py, the class GuessNumber), run in a python3 worker beside the trainer:
-- one instance per episode, reset and step sent as JSON requests while the other rows decode.
--
--   ./remax run recipes/guess_number_py.lua
--
-- The same game, the same rewards: only where the environment runs differs (docs/environments.md,
-- "Tools and environments in Python, or behind HTTP").
local recipe = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "guess_number.lua")
recipe.environment = "py:guess_number.py:GuessNumber"   -- found beside this recipe
return recipe
