"""EagleNest: a self-hosted, SageMaker-compatible EAGLE speculative-decoding service.

`eaglenest` is the one import name of the distribution. The repository keeps its code in
the top-level folders api/, workers/, models/, db/, migrations/, foundation/ and cli/; this
folder holds this file and a relative symlink to each of them, so `eaglenest.api` is api/
and so on (the wheel holds real copies under eaglenest/). Import them only as
`eaglenest.<folder>...`: a bare `import api` would load a second copy of every module it
touches (tests/test_layout.py fails on one).

What each folder holds and which may import which: docs/architecture.md (the contracts
themselves are in .importlinter, checked by `lint-imports`).
"""

__version__ = "0.1.0"
