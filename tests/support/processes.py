"""Processes the tests wait on: a serving process's group, gone or not."""

from __future__ import annotations

import time
from pathlib import Path


def process_group_alive(pgid: int) -> bool:
    """Whether any process of this process group (a serving process and its children) is
    still running; zombies waiting to be reaped count as gone."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def zombies_of(parent: int) -> list[int]:
    """The exited children of `parent` nobody has waited for (what a reaping owner leaves
    none of)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] == "Z" and int(fields[1]) == parent:
            found.append(int(proc.name))
    return found


def wait_group_gone(pgid: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while process_group_alive(pgid):
        if time.monotonic() > deadline:
            raise AssertionError(f"process group {pgid} still runs after {timeout:.0f} s")
        time.sleep(0.3)
