-- remax.train.tensorboard moved to remax.run.tensorboard (docs/architecture.md); this name keeps working for a while.
return require("remax.deprecated").moved("remax.train.tensorboard", "remax.run.tensorboard")
