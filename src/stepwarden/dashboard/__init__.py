"""The operator's dashboard: web pages, a JSON API (/api, described at /openapi.json) and
Prometheus metrics (/metrics), served from one process by `stepwarden dashboard`.

    stepwarden dashboard shop:app --port 8080         # http://127.0.0.1:8080/

Reads are open to whoever reaches it (it binds 127.0.0.1 unless told otherwise); operator
actions are POSTs that need the API token, or a signed-in session and its CSRF token.
Values marked secret are shown as `***`.
"""

from __future__ import annotations

import asyncio
import socket

from ..app import App
from ._auth import new_token
from ._server import create_app

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: any free port), made before the server starts so that
    its address can be printed."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


LOOPBACK_NAMES = ("127.0.0.1", "localhost")


def serve(app: App, sock: socket.socket, *, token: str) -> None:
    """Serve the dashboard of `app` on `sock` until interrupted (SIGINT, SIGTERM). Bound to
    127.0.0.1, it answers only requests addressed to 127.0.0.1 or localhost. A store that
    cannot be opened raises its error (StoreError, SchemaVersionError) before serving."""
    import uvicorn

    loopback = sock.getsockname()[0] == "127.0.0.1"
    config = uvicorn.Config(
        create_app(app, token=token, hosts=LOOPBACK_NAMES if loopback else None),
        log_level="warning",
        access_log=False,
        lifespan="on",
    )

    async def run() -> None:
        try:
            await app.store()  # opened on the server's event loop, and its errors shown plainly
            await uvicorn.Server(config).serve(sockets=[sock])
        finally:
            await app.aclose()

    asyncio.run(run())


__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "bind", "create_app", "new_token", "serve"]
