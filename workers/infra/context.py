"""What a worker task needs: settings, the database and its own identity."""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path

from eaglenest.db.session import Database
from eaglenest.foundation.queue import TaskQueue
from eaglenest.foundation.settings import Settings


@dataclass
class WorkerContext:
    settings: Settings
    db: Database
    queue: TaskQueue
    owner: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    lease_seconds: float = 60.0
    #: set when the worker begins a warm shutdown: running jobs checkpoint and hand back
    shutting_down: threading.Event = field(default_factory=threading.Event)

    @property
    def children_dir(self) -> Path:
        """Records of the child processes workers on this host started (foundation/children.py)."""
        return self.settings.data_dir / "children"
