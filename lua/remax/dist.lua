-- remax.dist moved to remax.bind.dist (docs/architecture.md); this name keeps working for a while: use require("remax").dist.
return require("remax.deprecated").moved("remax.dist", "remax.bind.dist")
