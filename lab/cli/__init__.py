"""The command line, `python -m lab ...`: `train|resume|list|show` (main.py, which parses every
subcommand and dispatches), `ablate|sample` (probe.py), `sweep` (sweep.py) and `publish` (publish.py)."""
