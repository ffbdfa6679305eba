-- remax.train.rollout moved to remax.step.rollout (docs/architecture.md); this name keeps working for a while.
return require("remax.deprecated").moved("remax.train.rollout", "remax.step.rollout")
