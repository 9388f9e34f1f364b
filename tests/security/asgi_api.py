"""The API in this process (no `eaglenest up`): the real app over a migrated SQLite data dir
and an unreachable broker, called with SigV4-signed requests as botocore signs them. For
tests that need the API's answers but no worker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from starlette.testclient import TestClient

REGION = "us-east-1"


class InProcessApi:
    def __init__(self, data_dir: Path) -> None:
        from eaglenest.api.app import create_app
        from eaglenest.db.migrate import upgrade_head
        from eaglenest.foundation.settings import Settings

        self.settings = Settings(data_dir=data_dir, region=REGION)
        upgrade_head(self.settings.resolved_database_url())
        self.client = TestClient(create_app(self.settings, "redis://127.0.0.1:1/0"))

    def call(self, op: str, body: dict[str, Any], key: str, secret: str) -> Any:
        """POST one SageMaker operation signed with (key, secret)."""
        data = json.dumps(body).encode()
        req = AWSRequest(method="POST", url="http://testserver/", data=data, headers={
            "X-Amz-Target": f"SageMaker.{op}", "Content-Type": "application/x-amz-json-1.1"})
        SigV4Auth(Credentials(key, secret), "sagemaker", REGION).add_auth(req)
        return self.client.post("/", content=data, headers=dict(req.headers.items()))
