"""`python -m lab ...`: see lab/cli/main.py."""
import sys

from lab.cli.main import main

sys.exit(main())
