"""`python -m eaglenest.workers.cli ...`: the `eaglenest` command."""

import sys

from eaglenest.workers.cli.main import main

sys.exit(main())
