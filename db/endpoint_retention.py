"""What UpdateEndpoint keeps of the running endpoint (pure functions over its row's JSON).

- RetainAllVariantProperties=true keeps, for each variant of the new config that the
  endpoint already runs, its current weight and instance count and the endpoint's Data
  Capture configuration; ExcludeRetainedVariantProperties names the ones (DesiredWeight,
  DesiredInstanceCount, DataCaptureConfig) to take from the new config instead. False (the
  default) takes everything from the new config.
- DeploymentConfig given: it is the endpoint's LastDeploymentConfig from then on;
  RetainDeploymentConfig=true keeps the previous one; neither: the update has none.

Keys in the endpoint row's `spec`: `VariantOverrides` (weights/counts in force),
`RetainedCapture` ({"value": capture config or None}: replaces the config's), and while an
update is pending `PendingOverrides` / `PendingCapture`.
"""

from __future__ import annotations

from typing import Any

from eaglenest.foundation.errors import ValidationException

OVERRIDES, PENDING_OVERRIDES = "VariantOverrides", "PendingOverrides"
RETAINED_CAPTURE, PENDING_CAPTURE = "RetainedCapture", "PendingCapture"
DEPLOYMENT_CONFIG = "DeploymentConfig"


def capture_config(endpoint_spec: dict[str, Any],
                   config_spec: dict[str, Any] | None) -> dict[str, Any] | None:
    """The Data Capture configuration in force: a retained one, else the config's."""
    if RETAINED_CAPTURE in endpoint_spec:
        value: dict[str, Any] | None = endpoint_spec[RETAINED_CAPTURE]["value"]
        return value
    return (config_spec or {}).get("DataCaptureConfig")


def deployment_config(endpoint_spec: dict[str, Any],
                      request: dict[str, Any]) -> dict[str, Any] | None:
    """The update's deployment configuration (becomes LastDeploymentConfig)."""
    given, retain = request.get(DEPLOYMENT_CONFIG), request.get("RetainDeploymentConfig")
    if given is not None and retain:
        raise ValidationException(
            "DeploymentConfig and RetainDeploymentConfig=true cannot be specified together: "
            "either give a new deployment configuration or keep the last one.")
    if given is not None:
        return dict(given)
    previous: dict[str, Any] | None = endpoint_spec.get(DEPLOYMENT_CONFIG)
    return previous if retain else None


def retained(endpoint_spec: dict[str, Any], deployment: dict[str, Any],
             old_config: dict[str, Any] | None, new_config: dict[str, Any],
             request: dict[str, Any]) -> dict[str, Any]:
    """The `spec` entries a pending update carries: the overrides for the new config's
    variants and, if the capture configuration is retained, that configuration."""
    if not request.get("RetainAllVariantProperties"):
        return {PENDING_OVERRIDES: {}}
    excluded = {p["VariantPropertyType"]
                for p in request.get("ExcludeRetainedVariantProperties") or []}
    running = {v["VariantName"]: v for v in deployment.get("ProductionVariants") or []}
    overrides: dict[str, dict[str, Any]] = {}
    for variant in new_config["ProductionVariants"]:
        now = running.get(variant["VariantName"])
        if now is None:
            continue
        kept = {}
        if "DesiredWeight" not in excluded:
            kept["DesiredWeight"] = now["CurrentWeight"]
        if "DesiredInstanceCount" not in excluded:
            kept["DesiredInstanceCount"] = now["CurrentInstanceCount"]
        if kept:
            overrides[variant["VariantName"]] = kept
    out: dict[str, Any] = {PENDING_OVERRIDES: overrides}
    if "DataCaptureConfig" not in excluded:
        out[PENDING_CAPTURE] = {"value": capture_config(endpoint_spec, old_config)}
    return out


def settle(spec: dict[str, Any], applied: bool) -> dict[str, Any]:
    """The row's `spec` once a pending update is done: applied (its overrides and retained
    capture take effect) or rolled back (the running ones stay)."""
    out = {k: v for k, v in spec.items()
           if k not in ("PendingUpdate", PENDING_OVERRIDES, PENDING_CAPTURE)}
    if applied:
        out[OVERRIDES] = spec.get(PENDING_OVERRIDES) or {}
        out.pop(RETAINED_CAPTURE, None)
        if PENDING_CAPTURE in spec:
            out[RETAINED_CAPTURE] = spec[PENDING_CAPTURE]
    return out
