"""The operator's dashboard: web pages, a JSON API (/api, described at /openapi.json) and
Prometheus metrics (/metrics), served from one process by `stepwarden dashboard`, beside the
application API (/api/v1, described at /api/v1/openapi.json) that services call with their
clients' tokens (`--api-tokens FILE`).

    stepwarden dashboard shop:app --port 8080         # http://127.0.0.1:8080/

Reads are open to whoever reaches it on a loopback address (it binds 127.0.0.1 unless told
otherwise), but for a request that came through a proxy, and need the API token or a
signed-in session on any other address (`auth_reads`);
operator actions are POSTs that need the API token, or a signed-in session and its CSRF
token. Requests addressed to a host it does not serve are refused, on every address. Values
marked secret are shown as `***`. Every request of the application API needs a client's
token with the scope of its route (submit, read, events, cancel), on every address, and
stays within the bounds of the client's settings in the tokens file.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from .. import _tokens
from ..app import App
from ._auth import check_token, new_token, read_token_file, state_directory, write_new_token
from ._server import create_app

if TYPE_CHECKING:
    import uvicorn

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: any free port), made before the server starts so that
    its address can be printed."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or `localhost`) reaches this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def served_hosts(sock: socket.socket, allowed_hosts: Sequence[str] = ()) -> list[str]:
    """The hosts a request may name: the loopback names, the bound address (unless it is
    every address: 0.0.0.0 or ::) and those allowed."""
    bound = str(sock.getsockname()[0])
    specific = not ipaddress.ip_address(bound).is_unspecified
    return [*LOOPBACK_NAMES, *([bound] if specific else []), *allowed_hosts]


def serve(
    app: App,
    sock: socket.socket,
    *,
    token: str,
    allowed_hosts: Sequence[str] = (),
    auth_reads: bool | None = None,
    api_tokens: str | os.PathLike[str] | None = None,
) -> None:
    """Serve the dashboard of `app` on `sock` until interrupted (SIGINT, SIGTERM). It answers
    only requests addressed to a host of `served_hosts` (whatever the address it is bound
    to); reads need the token unless bound to a loopback address, where those of a request
    that came through a proxy still do (or as `auth_reads` says). The application API's
    clients are those of the tokens file `api_tokens`. A store that cannot be opened raises
    its error (StoreError, SchemaVersionError) before serving."""
    import uvicorn

    if auth_reads is None and not is_loopback(str(sock.getsockname()[0])):
        auth_reads = True
    web = create_app(
        app,
        token=token,
        hosts=served_hosts(sock, allowed_hosts),
        auth_reads=auth_reads,
        api_tokens=api_tokens,
    )
    config = uvicorn.Config(web, log_level="warning", access_log=False, lifespan="on")

    async def run() -> None:
        try:
            await app.store()  # opened on the server's event loop, and its errors shown plainly
            await server(config, web.state.stopping).serve(sockets=[sock])
        finally:
            await app.aclose()

    asyncio.run(run())


def new_api_client(
    name: str, scopes: Iterable[str], settings: Iterable[str] = ()
) -> tuple[str, str]:
    """A new client of the application API, as `stepwarden api-token` makes it: its token
    (give it to the client; it is kept nowhere else) and its line for the tokens file,
    `NAME SCOPES SHA256 [SETTING=VALUE ...]`, which holds the token's SHA-256 digest.
    `scopes`: among submit, read, events and cancel (`agent:NAME` is reserved); `settings`:
    `SETTING=VALUE` each (`stepwarden api-token --help` lists them). ConfigurationError for
    a bad name, scope or setting."""
    token, client = _tokens.new_client(name, scopes, settings)
    return token, client.line()


def server(config: uvicorn.Config, stopping: asyncio.Event) -> uvicorn.Server:
    """A uvicorn server that sets `stopping` (the `state.stopping` of `create_app`'s
    application) when it begins to shut down: the application API's long polls then answer
    and its streams end, instead of holding the shutdown for as long as their clients stay
    (their clients ask again elsewhere, a stream's with Last-Event-ID)."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            stopping.set()
            await super().shutdown(sockets)

    return Server(config)


__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "bind",
    "check_token",
    "create_app",
    "is_loopback",
    "new_api_client",
    "new_token",
    "read_token_file",
    "serve",
    "served_hosts",
    "server",
    "state_directory",
    "write_new_token",
]
