"""An endpoint's deployment record, as a serve worker writes it and sagemaker-runtime reads it.

`EndpointRow.deployment["Servers"]` maps each production variant to a record; the record
lists its serving processes under `instances` (each with `url` and `pid`), and repeats the
first one's `url`/`pid` at its top level.
"""

from __future__ import annotations

from typing import Any


def instances_of(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Every serving process of a variant (a record written before `instances` existed
    describes one process itself)."""
    return list(record.get("instances") or [record])
