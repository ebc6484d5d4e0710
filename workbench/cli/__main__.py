"""`python -m workbench.cli ...`: the same as the `workbench` console script."""

import sys

from workbench.cli import main

sys.exit(main())
