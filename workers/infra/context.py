"""What a worker task needs: settings, the database and its own identity."""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from eaglenest.db.session import Database
from eaglenest.foundation.host import children
from eaglenest.foundation.queue import TaskQueue
from eaglenest.foundation.settings import Settings
from eaglenest.workers.infra.metrics import ProcessMetrics
from eaglenest.workers.infra.placement import Placer


@dataclass
class WorkerContext:
    settings: Settings
    db: Database
    queue: TaskQueue
    #: unique among live workers: the machine (host name and PID namespace:
    #: foundation/host/children.py ``machine``) and the pid
    owner: str = field(default_factory=lambda: f"{children.HOST}:{os.getpid()}")
    lease_seconds: float = 60.0
    #: set when the worker begins a warm shutdown: running jobs checkpoint and hand back
    shutting_down: threading.Event = field(default_factory=threading.Event)
    #: the queues this worker consumes ("train,serve"), as placement offers them to hosts
    queues: str = ""

    @functools.cached_property
    def placer(self) -> Placer:
        """GPU placement on this worker's host (workers/infra/placement.py)."""
        return Placer(self.settings, self.db, self.owner, self.queues)

    @functools.cached_property
    def metrics(self) -> ProcessMetrics:
        """The worker's metric buffer (one per process) and samplers
        (workers/infra/metrics.py); workers/infra/celery_app.py starts and closes it."""
        return ProcessMetrics(self.settings, self.db)

    @property
    def kernels_dir(self) -> Path:
        """The host's linear-kernel timing cache (Settings.kernels_dir)."""
        return self.settings.kernels_dir

    @property
    def children_dir(self) -> Path:
        """Records of the child processes workers on this host started
        (foundation/host/children.py)."""
        return self.settings.data_dir / "children"
