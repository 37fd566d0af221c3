"""The toy tasks: `shapes` is the one registry (each task's alphabet, lengths and layout; plain arithmetic,
no torch, so a config can check itself), `batches` their generators (torch). Importing this package imports
neither."""
