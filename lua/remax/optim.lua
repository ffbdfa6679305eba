-- remax.optim moved to remax.bind.optim (docs/architecture.md); this name keeps working for a while: use require("remax").optim.
return require("remax.deprecated").moved("remax.optim", "remax.bind.optim")
