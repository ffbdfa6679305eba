-- remax.jinja moved to remax.text.jinja (docs/architecture.md); this name keeps working for a while: use require("remax").jinja.
return require("remax.deprecated").moved("remax.jinja", "remax.text.jinja")
