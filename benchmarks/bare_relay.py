"""A bare TCP relay: bytes in, bytes out, no HTTP, for `benchmarks.endpoint --bare-relay`.

    python -m benchmarks.bare_relay --port LISTEN --to HOST:PORT

Every accepted connection gets its own connection to the model server and the bytes are
copied both ways as they arrive (asyncio protocols, uvloop when installed, TCP_NODELAY as
asyncio sets it). Its latency is what any extra hop costs on the host, with none of the
proxy's work (SigV4, routing, framing): the floor a proxy in front of the model sits on.
"""

from __future__ import annotations

import argparse
import asyncio
import sys


class _Pipe(asyncio.Protocol):
    """One side of a relayed connection; what it reads goes to `peer`'s transport."""

    def __init__(self, peer: _Pipe | None = None) -> None:
        self.peer = peer
        self.transport: asyncio.Transport | None = None
        self.pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write(data)
        else:
            self.pending.append(data)  # the upstream connection is not open yet

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


def _serve(host: str, port: int) -> type[_Pipe]:
    class Downstream(_Pipe):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            asyncio.get_running_loop().create_task(self._open())

        async def _open(self) -> None:
            loop = asyncio.get_running_loop()
            _, up = await loop.create_connection(lambda: _Pipe(self), host, port)
            self.peer = up
            assert up.transport is not None  # connection_made ran before create_connection returned
            for data in self.pending:
                up.transport.write(data)
            self.pending.clear()

    return Downstream


async def main_async(listen: int, to: str) -> None:
    host, _, port = to.rpartition(":")
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_serve(host, int(port)), "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--to", required=True, help="HOST:PORT of the model server")
    args = p.parse_args()
    try:
        import uvloop

        uvloop.run(main_async(args.port, args.to))
    except ImportError:
        asyncio.run(main_async(args.port, args.to))
    return 0


if __name__ == "__main__":
    sys.exit(main())
