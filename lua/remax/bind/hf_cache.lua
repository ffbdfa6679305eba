-- remax.bind.hf_cache moved to remax.formats.hf_cache (docs/architecture.md); this name keeps working for a while.
return require("remax.deprecated").moved("remax.bind.hf_cache", "remax.formats.hf_cache")
