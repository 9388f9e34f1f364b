"""`python -m eaglenest.cli ...`: the `eaglenest` command."""

import sys

from eaglenest.cli.main import main

sys.exit(main())
