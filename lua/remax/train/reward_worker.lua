-- remax.train.reward_worker moved to remax.step.reward_worker (docs/architecture.md); this name keeps working for a while.
return require("remax.deprecated").moved("remax.train.reward_worker", "remax.step.reward_worker")
