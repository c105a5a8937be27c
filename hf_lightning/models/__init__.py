"""Models and tokenizers: from a folder, a hub id or a package, with failures that name the culprit."""
