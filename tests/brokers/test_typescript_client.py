"""Tasks submitted over HTTP by the TypeScript client (clients/typescript), their status
messages on the application's own broker (a RabbitMQ queue, a NATS JetStream subject, of the
test's own): every message arrives, each task's in order, across a restart of the broker."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..agentserver import api_server
from ..conftest import unique
from ..support.relay import all_processed, assert_delivered, build, outbox_of
from ..support.typescript import compiled_library
from ..support.worker import running
from .own import OwnBroker, running_broker

SUBMIT_JS = """
import { Client } from "%(library)s";
const client = new Client({ url: process.env.STEPWARDEN_URL, token: process.env.TOKEN });
const ids = [];
for (const n of JSON.parse(process.env.INPUTS)) {
  const task = await client.submit("three", n, { replyTo: process.env.REPLY_TO });
  ids.push(task.taskId);
}
console.log(JSON.stringify(ids));
"""


@pytest.fixture(scope="module", params=["amqp", "nats"])
def broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OwnBroker]:
    with running_broker(request.param, tmp_path_factory.mktemp(f"broker-{request.param}")) as own:
        yield own


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compiled_library(tmp_path_factory.mktemp("ts-library"))


def submit_from_typescript(
    library: Path, tmp_path: Path, url: str, token: str, reply_to: str, inputs: list[int]
) -> list[str]:
    script = tmp_path / "submit.mjs"
    script.write_text(SUBMIT_JS % {"library": (library / "src" / "index.js").as_uri()})
    done = subprocess.run(
        ["node", str(script)],
        env={
            "PATH": "/usr/bin:/bin",
            "STEPWARDEN_URL": url,
            "TOKEN": token,
            "REPLY_TO": reply_to,
            "INPUTS": json.dumps(inputs),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ids: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return ids


async def test_tasks_submitted_by_the_typescript_client_have_their_messages_across_a_restart(
    store_url: str, broker: OwnBroker, library: Path, tmp_path: Path
) -> None:
    name = unique("ts").replace("-", "_")
    await broker.prepare(name)
    app = build(store_url, broker.listed())
    clients = {"shop": ["submit", "read", "destinations=own"]}
    with api_server(lambda: build(store_url, broker.listed()), clients, tmp_path) as (
        url,
        tokens,
    ):
        token = tokens["shop"]
        async with app, running(app):

            async def submit(inputs: list[int]) -> list[str]:
                return await asyncio.to_thread(
                    submit_from_typescript, library, tmp_path, url, token, broker.url(name), inputs
                )

            before = await submit([0, 1, 2])
            await all_processed(broker, name, before)
            await asyncio.to_thread(broker.stop)
            during = await submit([3, 4, 5, 6])
            for n, task_id in zip(range(3, 7), during, strict=True):
                assert await app.result_async(task_id, timeout=30) == [n, n + 1, n + 2]
            await asyncio.to_thread(broker.start)
            received = await all_processed(broker, name, before + during)
            assert_delivered(received, await outbox_of(app, before + during))
