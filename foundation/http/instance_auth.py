"""A serving instance's secret: only the process EagleNest started and the proxy know it.

Contract:
- The worker generates a secret per instance, hands it to the model server in its
  environment (`SECRET_ENV`; never on the command line, which every local user can read)
  and stores it in the endpoint's deployment (the database), where the proxy reads it.
- The model server runs `InstanceGuard` (the embedded server wraps its app; vLLM loads it
  with `--middleware`, besides its own `--api-key` check through VLLM_API_KEY): every HTTP
  request must carry ``Authorization: Bearer <secret>`` (else 401), and a request with a
  `CHALLENGE` header gets `PROOF` = HMAC-SHA256(secret, challenge) in its reply.
- Callers verify the proof before they trust a process (`probe`; the proxy once per new
  connection, foundation.http.backend_client): a process that took over a dead instance's port
  cannot answer it, so it never receives a prompt and never passes a health check.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from typing import Any

from eaglenest.foundation.http.asgi import reply

SECRET_ENV = "EAGLENEST_INSTANCE_SECRET"
CHALLENGE = "x-eaglenest-challenge"
PROOF = "x-eaglenest-proof"


def new_secret() -> str:
    return secrets.token_hex(32)


def proof(secret: str, challenge: str) -> str:
    return hmac.new(secret.encode(), challenge.encode(), hashlib.sha256).hexdigest()


def handshake(secret: str) -> tuple[dict[str, str], str]:
    """Headers of a health request that asks for the proof, and the proof expected."""
    challenge = secrets.token_hex(16)
    return ({"Authorization": f"Bearer {secret}", CHALLENGE: challenge},
            proof(secret, challenge))


def probe(base_url: str, secret: str | None, timeout: float = 3.0) -> bool:
    """Whether the instance at `base_url` answers /health and, with a secret, proves it
    knows it (a record without one: /health alone)."""
    import httpx

    headers, expected = handshake(secret) if secret else ({}, "")
    try:
        r = httpx.get(f"{base_url}/health", headers=headers, timeout=timeout)
    except httpx.HTTPError:
        return False
    if r.status_code != 200:
        return False
    return not secret or hmac.compare_digest(r.headers.get(PROOF, ""), expected)


class InstanceGuard:
    """ASGI middleware of a model server (module docstring). Without a secret (neither
    given nor in the environment) it lets everything through: a server started by hand."""

    def __init__(self, app: Any, secret: str | None = None) -> None:
        self.app = app
        key = secret if secret is not None else os.environ.get(SECRET_ENV, "")
        self._bearer = f"Bearer {key}".encode() if key else b""
        self._key = key

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not self._bearer:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if not hmac.compare_digest(headers.get(b"authorization", b""), self._bearer):
            body = json.dumps({"object": "error", "message": "missing or wrong instance key",
                               "type": "Unauthorized", "code": 401}).encode()
            await reply(send, 401, body, b"application/json")
            return
        challenge = headers.get(CHALLENGE.encode())
        if challenge is None:
            await self.app(scope, receive, send)
            return
        answer = proof(self._key, challenge.decode("latin-1")).encode()

        async def send_with_proof(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []),
                                                  (PROOF.encode(), answer)]}
            await send(message)

        await self.app(scope, receive, send_with_proof)
