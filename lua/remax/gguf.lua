-- remax.gguf moved to remax.formats.gguf (docs/architecture.md); this name keeps working for a while: use require("remax").gguf.
return require("remax.deprecated").moved("remax.gguf", "remax.formats.gguf")
