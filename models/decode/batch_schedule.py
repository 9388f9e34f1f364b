"""Which decoding and K each ``BatchEngine`` step runs (models/decode/batch.py).

A schedule is a list of entries ``(max_running, K)`` or ``(max_running, K, decoding)``
ascending by ``max_running`` (workers/model_servers/schedule.py writes them): with n rows in
the batch the first entry with ``max_running >= n`` is in force (the last one beyond it); K =
0 is a plain step; ``decoding`` is a Decoding name (models/decode/modes.py), None meaning the
engine's own. Example ``[(1, 4, "tree"), (4, 3, "chain"), (16, 0)]``: one row drafts a
depth-4 tree, 2-4 rows chain K=3, plain from 5 rows on.

Each decoding keeps a ``Lane``: its mode, its adaptive controller (one per decoding, so
what the tree's controller learnt is not overwritten by chain rounds), the K the controller
chose last and the scheduled K of its last step. Switching decodings between steps swaps the
engine's lane; every request's head state (HeadDrafter: committed head KV, last logits) is
the same whatever the mode that drafts from it, so a tree step may follow a chain step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from eaglenest.models.decode.adaptive import AdaptiveDepth
from eaglenest.models.decode.modes import DecodeMode, Decoding, HeadTraits, schedule_refusal

Entry = tuple[int, int] | tuple[int, int, str | None]  # (max_running, K[, decoding])
Step = tuple[int, int, str | None]  # (max_running, K, decoding or None)


@dataclass
class Lane:
    """One decoding's drafting state, kept between the steps it runs."""

    mode: DecodeMode
    controller: AdaptiveDepth | None  # adaptive decodings only
    current_k: int  # the controller's last choice (else the scheduled K)
    cap: int | None = None  # the scheduled K of its last step (a new one restarts it)


def steps(schedule: Sequence[Entry]) -> list[Step]:
    """The entries as (max_running, K, decoding) with the decodings checked: ValueError
    naming an unknown one (Decoding.parse's message lists the valid names)."""
    out: list[Step] = []
    for entry in schedule:
        m, k = int(entry[0]), int(entry[1])
        decoding = entry[2] if len(entry) > 2 else None  # type: ignore[misc]
        if decoding is not None:
            Decoding.parse(decoding)
        out.append((m, k, decoding if k > 0 else None))
    return out


def step_for(schedule: list[Step], running: int) -> Step:
    """The entry in force with ``running`` rows."""
    for entry in schedule:
        if running <= entry[0]:
            return entry
    return schedule[-1]


def check(schedule: list[Step], head: HeadTraits | None) -> None:
    """ValueError naming the first scheduled decoding ``head`` cannot draft in."""
    reason = schedule_refusal([d for _, _, d in schedule if d], head) if head else None
    if reason is not None:
        raise ValueError(reason)


def lanes(schedule: list[Step], own: str, own_lane: Lane,
          new_controller: Callable[[DecodeMode, int], AdaptiveDepth]) -> dict[str, Lane]:
    """The engine's own lane (``own``: its decoding's name) and one per other scheduled
    decoding, starting at the largest K the schedule gives it; ``new_controller(mode,
    start)`` makes an adaptive decoding's controller."""
    out = {own: own_lane}
    for _, _, name in schedule:
        if name is None or name in out:
            continue
        decoding = Decoding.parse(name)
        start = max(k for _, k, d in schedule if d == name)
        controller = new_controller(decoding.mode, start) if decoding.adaptive else None
        out[name] = Lane(decoding.mode, controller, start)
    return out
