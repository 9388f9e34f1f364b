"""An endpoint's deployment record, as a serve worker writes it and sagemaker-runtime reads it.

`EndpointRow.deployment["Servers"]` maps each production variant to a record; the record
lists its serving processes under `instances` (each with `url` and `pid`), and repeats the
first one's `url`/`pid` at its top level.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def instances_of(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Every serving process of a variant (a record written before `instances` existed
    describes one process itself)."""
    return list(record.get("instances") or [record])


def deployed_images(record: dict[str, Any]) -> list[dict[str, Any]]:
    """A variant's DeployedImages (SageMaker's DeployedImage): SpecifiedImage, the model
    container's Image (absent when it has none); ResolvedImage, what serves it
    (``eaglenest/<backend>:<version>``, workers/serving/records.py; a record written before
    it was kept gives ``eaglenest/<backend>``); ResolutionTime, when its servers started."""
    image: dict[str, Any] = {}
    if record.get("image"):
        image["SpecifiedImage"] = record["image"]
    resolved = record.get("resolved_image") or (
        f"eaglenest/{record['backend']}" if record.get("backend") else None)
    if resolved:
        image["ResolvedImage"] = resolved
    if record.get("resolved_at") is not None:
        image["ResolutionTime"] = datetime.fromtimestamp(float(record["resolved_at"]), UTC)
    return [image] if image else []


def variant_summaries(deployment: dict[str, Any]) -> list[dict[str, Any]] | None:
    """DescribeEndpoint's ProductionVariants of a deployment record (or of its `Shift`
    part): the stored summaries, each with the DeployedImages of its variant's record."""
    summaries = deployment.get("ProductionVariants")
    if summaries is None:
        return None
    servers = deployment.get("Servers") or {}
    out = []
    for summary in summaries:
        images = deployed_images(servers.get(summary["VariantName"]) or {})
        out.append({**summary, "DeployedImages": images} if images else dict(summary))
    return out
