-- remax.plot moved to remax.run.plot (docs/architecture.md); this name keeps working for a while: use require("remax").plot.
return require("remax.deprecated").moved("remax.plot", "remax.run.plot")
