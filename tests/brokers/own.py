"""Broker instances of a test's own, on free ports, in its own directories: NATS with
JetStream, Redis (append-only file, so that a stream outlives a restart) and RabbitMQ (its own
node name, ports and data; run as the `rabbitmq` user when the tests run as root). The shared
brokers on the standard ports are never touched.

Each keeps its data across `stop()` and `start()`, a restart as an operator would make one.
`received(name)` reads what the relay put on a destination, oldest first, as the JSON bodies
it sent (RabbitMQ: taken off the queue and kept here, so that every call returns all of
them)."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stepwarden.destinations import Destinations

STARTUP = 60.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 0.2).close()
    except OSError:
        return False
    return True


class OwnBroker:
    scheme = ""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    # -- the process ----------------------------------------------------------------------
    def command(self) -> tuple[list[str], dict[str, str], str | None]:
        raise NotImplementedError

    def start(self) -> None:
        cmd, env, user = self.command()
        self.starts += 1
        log = open(self.workdir / f"broker-{self.starts}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd,
            env={"PATH": os.environ["PATH"], **env},
            cwd=self.workdir,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            user=user,
            group=user,
        )
        log.close()
        deadline = time.monotonic() + STARTUP
        while not _listening(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{self.scheme} broker did not start: {self.log()}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the broker (SIGTERM to its process group, as a service manager does)."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        deadline = time.monotonic() + 30
        while _listening(self.port) and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self) -> None:
        """Stop the broker for good."""
        self.stop()

    def log(self) -> str:
        path = self.workdir / f"broker-{self.starts}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def url(self, name: str) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}/{name}"

    def listed(self, entry: str = "own") -> Destinations:
        """The destinations of a list that names this broker, every name on it allowed."""
        return Destinations.parse(f"{entry} {self.scheme}://127.0.0.1:{self.port} *")

    # -- the destination ------------------------------------------------------------------
    async def prepare(self, name: str) -> None:
        """Make the destination a consumer reads (a stream capturing the subject, a queue)."""

    async def received(self, name: str) -> list[dict[str, Any]]:
        raise NotImplementedError


class OwnNats(OwnBroker):
    scheme = "nats"

    def command(self) -> tuple[list[str], dict[str, str], str | None]:
        store = self.workdir / "jetstream"
        return (
            ["nats-server", "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(store)],
            {},
            None,
        )

    async def prepare(self, name: str) -> None:
        import nats

        client = await nats.connect(f"nats://127.0.0.1:{self.port}")
        try:
            await client.jetstream().add_stream(name=_stream(name), subjects=[name])
        finally:
            await client.close()

    async def received(self, name: str) -> list[dict[str, Any]]:
        import nats

        client = await nats.connect(f"nats://127.0.0.1:{self.port}")
        try:
            stream = client.jetstream()
            info = await stream.stream_info(_stream(name))
            found: list[dict[str, Any]] = []
            if not info.state.messages:
                return found
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                msg = await stream.get_msg(_stream(name), seq)
                body = json.loads(msg.data or b"")
                assert msg.headers is not None
                assert msg.headers["Nats-Msg-Id"] == body["id"]
                found.append(body)
            return found
        finally:
            await client.close()


def _stream(subject: str) -> str:
    return subject.replace(".", "_").upper()


class OwnRedis(OwnBroker):
    scheme = "redis"

    def __init__(self, workdir: Path, password: str | None = None) -> None:
        super().__init__(workdir)
        self.password = password

    def command(self) -> tuple[list[str], dict[str, str], str | None]:
        auth = ["--requirepass", self.password] if self.password else []
        return (
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.workdir),
             *auth],
            {},
            None,
        )  # fmt: skip

    async def received(self, name: str) -> list[dict[str, Any]]:
        from redis import asyncio as aioredis

        client = aioredis.Redis(host="127.0.0.1", port=self.port, password=self.password)
        try:
            found = []
            for _, entry in await client.xrange(name) or []:
                fields: dict[Any, Any] = entry or {}
                body = json.loads(fields[b"message"])
                assert fields[b"id"].decode() == body["id"]
                assert fields[b"kind"].decode() == body["kind"]
                found.append(body)
            return found
        finally:
            await client.aclose()

    async def clients(self) -> list[str]:
        """The connections the broker has open, besides the one that asks: a line of
        CLIENT LIST each (its age, idle time and last command)."""
        from redis import asyncio as aioredis

        client = aioredis.Redis(host="127.0.0.1", port=self.port, password=self.password)
        try:
            listed: list[dict[str, Any]] = await client.client_list()
            mine = await client.client_id()
            return [
                " ".join(f"{k}={v}" for k, v in entry.items())
                for entry in listed
                if int(entry["id"]) != mine
            ]
        finally:
            await client.aclose()


class OwnRabbit(OwnBroker):
    scheme = "amqp"

    def __init__(self, workdir: Path) -> None:
        # Its own folder under /tmp: the node runs as `rabbitmq`, who cannot reach into the
        # test's temporary folder (mode 0700, root's).
        super().__init__(Path(tempfile.mkdtemp(prefix="stepwarden-rabbitmq-")))
        self.dist_port = free_port()
        self.kept: dict[str, list[dict[str, Any]]] = {}
        (self.workdir / "enabled_plugins").write_text("[].")
        self.user = "rabbitmq" if os.geteuid() == 0 else None
        if self.user:
            owner = pwd.getpwnam(self.user)
            for path in [self.workdir, *self.workdir.rglob("*")]:
                os.chown(path, owner.pw_uid, owner.pw_gid)

    def command(self) -> tuple[list[str], dict[str, str], str | None]:
        d = str(self.workdir)
        env = {
            "HOME": d,
            "RABBITMQ_NODENAME": f"stepwarden-test-{self.port}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": f"{d}/mnesia",
            "RABBITMQ_LOG_BASE": f"{d}/log",
            "RABBITMQ_ENABLED_PLUGINS_FILE": f"{d}/enabled_plugins",
            "RABBITMQ_PID_FILE": f"{d}/pid",
            "RABBITMQ_FEATURE_FLAGS_FILE": f"{d}/feature_flags",
            "RABBITMQ_PLUGINS_EXPAND_DIR": f"{d}/expand",
            "RABBITMQ_CONFIG_FILE": f"{d}/rabbitmq",
            "RABBITMQ_ADVANCED_CONFIG_FILE": f"{d}/advanced.config",
            "RABBITMQ_CONF_ENV_FILE": f"{d}/rabbitmq-env.conf",
        }
        server = "/usr/lib/rabbitmq/bin/rabbitmq-server"
        return [server if os.path.exists(server) else "rabbitmq-server"], env, self.user

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    async def prepare(self, name: str) -> None:
        import aio_pika

        connection = await aio_pika.connect(host="127.0.0.1", port=self.port)
        async with connection, connection.channel() as channel:
            await channel.declare_queue(name, durable=True)

    async def received(self, name: str) -> list[dict[str, Any]]:
        import aio_pika

        kept = self.kept.setdefault(name, [])
        connection = await aio_pika.connect(host="127.0.0.1", port=self.port)
        async with connection, connection.channel() as channel:
            queue = await channel.declare_queue(name, durable=True)
            while (message := await queue.get(no_ack=True, fail=False)) is not None:
                body = json.loads(message.body)
                assert message.message_id == body["id"]
                assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
                kept.append(body)
        return list(kept)


def make(scheme: str, workdir: Path) -> OwnBroker:
    if scheme == "amqp" and not shutil.which("rabbitmq-server"):
        raise AssertionError("RabbitMQ is not installed (apt-get install rabbitmq-server)")
    return {"amqp": OwnRabbit, "nats": OwnNats, "redis": OwnRedis}[scheme](workdir)


@contextlib.contextmanager
def running_broker(scheme: str, workdir: Path) -> Iterator[OwnBroker]:
    """A broker of the test's own, started, and stopped when the block ends."""
    own = make(scheme, workdir)
    own.start()
    try:
        yield own
    finally:
        own.close()
