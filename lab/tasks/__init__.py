"""The toy tasks: `shapes` is the one registry (each task's alphabet, lengths and layout; plain arithmetic,
no torch, so a config can check itself), `generator` the generators' base (torch), `batches` the lab's
generators and the registry of all of them, `chomsky` the generators of Delétang et al. 2023's tasks.
Importing this package imports none of them."""
