-- remax.bind.gguf moved to remax.formats.gguf (docs/architecture.md); this name keeps working for a while.
return require("remax.deprecated").moved("remax.bind.gguf", "remax.formats.gguf")
