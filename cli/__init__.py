"""The `eaglenest` command (main.py) and its subcommands: s3 (s3.py), bench (bench.py),
status (status.py); train, prepare-target and generate are parsed lazily from
eaglenest.models. `python -m eaglenest.cli` runs it without the console script."""
