"""SageMaker's JSON service: `X-Amz-Target: SageMaker.<Op>`, SigV4 signing name `sagemaker`.

Each module of this package holds one resource's operations and registers them with
`operation` (api/edge/registry.py checks their input and output classes)."""

from __future__ import annotations

from eaglenest.api.edge.registry import JsonService

SERVICE = JsonService(signing_name="sagemaker", target_prefix="SageMaker.")
operation = SERVICE.operation
