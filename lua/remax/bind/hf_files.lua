-- remax.bind.hf_files moved to remax.formats.hf_files (docs/architecture.md); this name keeps working for a while.
return require("remax.deprecated").moved("remax.bind.hf_files", "remax.formats.hf_files")
