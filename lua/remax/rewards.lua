-- remax.rewards moved to remax.step.rewards (docs/architecture.md); this name keeps working for a while: use require("remax").rewards.
return require("remax.deprecated").moved("remax.rewards", "remax.step.rewards")
