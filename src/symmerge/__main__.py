"""`python -m symmerge ...`: the same command line as `symmerge ...` (also under torchrun)."""

import sys

from .cli import main

sys.exit(main())
