"""`python -m lab ...`: see lab/cli.py."""
import sys

from lab.cli import main

sys.exit(main())
