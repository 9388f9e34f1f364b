"""configure_logging for one test, the root logger restored afterwards."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from eaglenest.workers.infra.logs import LogFormat, configure_logging


@contextmanager
def configured_logging(fmt: LogFormat = "text") -> Iterator[logging.Logger]:
    """The worker's logging set-up (workers/infra/logs.py) inside the block; the root
    logger's handlers, level and warnings capture as they were after it."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging(fmt)
        yield root
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])
        logging.captureWarnings(False)
