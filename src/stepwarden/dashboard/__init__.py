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

The server (`serve`) closes a connection that sends its request's headers or body too
slowly and holds at most so many connections at once (`Limits`, `_http`); it believes the
`X-Forwarded-For` and `X-Forwarded-Proto` headers only from the proxies it is told of
(`forwarded_allow_ips`), and otherwise counts each request against its peer's address.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .. import _tokens
from ..app import App
from ..errors import ConfigurationError
from ._auth import check_token, new_token, read_token_file, state_directory, write_new_token
from ._http import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    Gate,
    Limits,
    connection_room,
)
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
    forwarded_allow_ips: Sequence[str] = (),
    limits: Limits | None = None,
) -> None:
    """Serve the dashboard of `app` on `sock` until interrupted (SIGINT, SIGTERM). It answers
    only requests addressed to a host of `served_hosts` (whatever the address it is bound
    to); reads need the token unless bound to a loopback address, where those of a request
    that came through a proxy still do (or as `auth_reads` says). The application API's
    clients are those of the tokens file `api_tokens`. The proxies whose `X-Forwarded-For`
    and `X-Forwarded-Proto` are believed are `forwarded_allow_ips` (see `_config`); the read
    deadlines and the cap on connections, `limits` (by default `Limits()`, its cap within
    this process's open-file limit: `connection_room`). A store that cannot be opened raises
    its error (StoreError, SchemaVersionError) before serving."""
    if auth_reads is None and not is_loopback(str(sock.getsockname()[0])):
        auth_reads = True
    if limits is None:
        room, _ = connection_room(DEFAULT_MAX_CONNECTIONS)
        limits = Limits(max_connections=room)
    web = create_app(
        app,
        token=token,
        hosts=served_hosts(sock, allowed_hosts),
        auth_reads=auth_reads,
        api_tokens=api_tokens,
    )
    gate = Gate(limits)
    settings = _config(web, forwarded_allow_ips, gate)
    listening = gate.listen(sock)

    async def run() -> None:
        try:
            await app.store()  # opened on the server's event loop, and its errors shown plainly
            await server(settings, web.state.stopping).serve(sockets=[listening])
        finally:
            await app.aclose()

    try:
        asyncio.run(run())
    finally:
        listening.close()


def _config(web: Any, forwarded_allow_ips: Sequence[str], gate: Gate) -> uvicorn.Config:
    """The uvicorn configuration `serve` runs the ASGI application `web` with: HTTP/1.1 by
    h11 with the read deadlines of `gate` (whose socket caps the connections), and no
    WebSocket; no access log; `X-Forwarded-For` and `X-Forwarded-Proto` believed only from
    a peer among `forwarded_allow_ips` (addresses or networks, `*` for any, as uvicorn and
    gunicorn name them), never by default: a process that can reach the dashboard cannot
    then pass for another address (nor lock it out, nor get around the count of its own
    wrong tokens)."""
    import uvicorn

    trusted = [address for address in forwarded_allow_ips if address]
    return uvicorn.Config(
        web,
        http=gate.protocol(),
        ws="none",  # no route is a WebSocket; an upgrade would leave the gate's count
        log_level="warning",
        access_log=False,
        lifespan="on",
        proxy_headers=bool(trusted),
        forwarded_allow_ips=trusted,
    )


def forwarded_allow_ips(text: str) -> list[str]:
    """The proxies a comma-separated list names (`--forwarded-allow-ips`): addresses, networks
    (`10.0.0.0/8`) or `*`. ConfigurationError for anything else."""
    found = [part.strip() for part in text.split(",") if part.strip()]
    for part in found:
        if part == "*":
            continue
        try:
            ipaddress.ip_network(part, strict=False)
        except ValueError:
            raise ConfigurationError(
                f"{part!r} is not an address, a network or '*' (--forwarded-allow-ips takes "
                "them separated by commas)"
            ) from None
    return found


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
    "DEFAULT_BODY_TIMEOUT",
    "DEFAULT_HEADER_TIMEOUT",
    "DEFAULT_HOST",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_PORT",
    "Limits",
    "bind",
    "check_token",
    "connection_room",
    "create_app",
    "forwarded_allow_ips",
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
