-- remax.reward_model moved to remax.bind.reward_model (docs/architecture.md); this name keeps working for a while: use require("remax").reward_model.
return require("remax.deprecated").moved("remax.reward_model", "remax.bind.reward_model")
