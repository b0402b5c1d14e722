"""Waiting tasks from the command line and the dashboard's API: a delayed submit, `show` of a
waiting task, and an event sent to it (once per event_id), on both stores."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import httpx
import orjson
from click.testing import Result

import stepwarden as sw
from stepwarden.dashboard import create_app
from stepwarden.supervisor import Supervisor
from tests.stores import app_store

from ..support.apps import Approvals
from ..support.poll import in_state
from ..support.worker import running
from . import cli_app
from .helpers import APP, assert_ok, assert_refused, invoke, sql

TOKEN = "a-token-of-24-characters"


def test_a_delayed_submit_waits_and_show_says_for_what(migrated_url: str) -> None:
    out = assert_ok(
        invoke("--app", APP, "--store", migrated_url, "submit", "process", "{}",
               "--task-id", "later", "--start-after", "3600")
    )  # fmt: skip
    assert out.strip() == "later"
    shown = assert_ok(invoke("--store", migrated_url, "show", "later"))
    assert "process_state  waiting" in shown and "waiting_for    start  until 20" in shown
    listed = assert_ok(invoke("--store", migrated_url, "tasks"))
    assert "waiting: 1" in listed and "waiting  " in listed and "start until 20" in listed
    data = orjson.loads(assert_ok(invoke("--store", migrated_url, "show", "later", "--json")))
    assert data["waiting_for"] == "start" and data["wake_at"] is not None
    assert_refused(
        invoke("--app", APP, "--store", migrated_url, "submit", "process", "{}",
               "--start-at", "2026-12-01T02:00:00"),
        "--start-at", "time zone",
        exit_code=2,
    )  # fmt: skip


def test_an_event_sent_from_the_command_line_and_the_api_wakes_the_task(
    migrated_url: str,
) -> None:
    async def scenario() -> None:
        shop = Approvals(migrated_url)
        app = shop.app
        try:
            # Sent before the workflow waits (no worker yet): kept, once per event_id.
            await app.submit_async("approval", 600, task_id="cli")
            sent = await asyncio.to_thread(
                invoke, "--store", migrated_url, "send", "cli", "approved", '"by cli"',
                "--event-id", "e-1",
            )  # fmt: skip
            assert assert_ok(sent).strip() == "cli: event 'approved' sent"
            again = await asyncio.to_thread(
                invoke, "--store", migrated_url, "send", "cli", "approved", "2",
                "--event-id", "e-1",
            )  # fmt: skip
            assert again.exit_code == 0 and "was sent before: nothing sent" in again.stderr
            async with running(app):
                assert await app.result_async("cli", timeout=20) == {"approved": "by cli"}
                await app.submit_async("approval", 600, task_id="api")
                waiting = await in_state(app, "api", sw.TaskState.WAITING)
                assert waiting.waiting_for == "event:approved"
                web = create_app(app, token=TOKEN)
                transport = httpx.ASGITransport(app=web)
                async with httpx.AsyncClient(
                    transport=transport, base_url="http://127.0.0.1"
                ) as client:
                    page = await client.get("/tasks/api")
                    assert 'id="waiting-for">event:approved<' in page.text
                    listing = (await client.get("/tasks")).text
                    assert 'class="quiet waiting">event:approved until' in listing
                    refused = await client.post(
                        "/api/tasks/api/send", json={"name": "approved", "payload": 1}
                    )
                    assert refused.status_code == 401
                    auth = {"Authorization": f"Bearer {TOKEN}"}
                    answer = await client.post(
                        "/api/tasks/api/send",
                        json={"name": "approved", "payload": {"ok": True}, "event_id": "ok"},
                        headers=auth,
                    )
                    assert answer.status_code == 200 and answer.json() == {
                        "sent": True,
                        "woke": True,
                    }
                    assert await app.result_async("api", timeout=20) == {"approved": {"ok": True}}
                    # Sent again once it finished the task: sent before, not refused.
                    resent = await client.post(
                        "/api/tasks/api/send",
                        json={"name": "approved", "payload": {"ok": True}, "event_id": "ok"},
                        headers=auth,
                    )
                    assert resent.status_code == 200 and resent.json() == {
                        "sent": False,
                        "woke": False,
                    }
                    finished = await client.post(
                        "/api/tasks/api/send", json={"name": "approved"}, headers=auth
                    )
                    assert finished.status_code == 409
                    missing = await client.post(
                        "/api/tasks/nobody/send", json={"name": "approved"}, headers=auth
                    )
                    assert missing.status_code == 404
        finally:
            await app.aclose()

    asyncio.run(scenario())
    gone = invoke("--store", migrated_url, "send", "cli", "approved")
    assert_refused(gone, "task 'cli' is processed: it takes no event", exit_code=1)
    again = invoke("--store", migrated_url, "send", "cli", "approved", "2", "--event-id", "e-1")
    assert again.exit_code == 0, again.output
    assert again.stderr == "cli: event 'approved' was sent before: nothing sent\n"
    assert_refused(invoke("--store", migrated_url, "send", "nobody", "x"), "no task", exit_code=1)


def test_schedules_from_the_command_line(migrated_url: str) -> None:
    """A supervisor stores the application's schedules; `schedules` lists them, `schedule
    pause|resume|trigger NAME` acts on them, and an unknown one is refused."""

    async def store_them() -> None:
        app = Approvals(migrated_url).app
        app.schedule("nightly", "plain", cron="0 2 * * *", input={"n": 1}, timezone="Europe/Paris")
        try:
            leader = Supervisor(
                await app_store(app), instance="sup", schedules=list(app.schedule_specs.values())
            )
            await leader.tick()
        finally:
            await app.aclose()

    asyncio.run(store_them())
    listed = assert_ok(invoke("--store", migrated_url, "schedules"))
    assert "nightly" in listed and "0 2 * * *" in listed and "active" in listed
    out = assert_ok(invoke("--store", migrated_url, "schedule", "pause", "nightly"))
    assert out.strip() == "nightly: paused"
    data = orjson.loads(assert_ok(invoke("--store", migrated_url, "schedules", "--json")))
    assert data["paused"] is True and data["timezone"] == "Europe/Paris"
    triggered = assert_ok(invoke("--store", migrated_url, "schedule", "trigger", "nightly"))
    task_id = triggered.split("task ", 1)[1].split()[0]
    shown = orjson.loads(assert_ok(invoke("--store", migrated_url, "show", task_id, "--json")))
    assert shown["workflow"] == "plain" and shown["input"] == {"n": 1}
    assert_refused(
        invoke("--store", migrated_url, "schedule", "resume", "nope"), "no schedule 'nope'"
    )


def test_schedules_on_the_dashboard_and_its_api(migrated_url: str) -> None:
    async def scenario() -> None:
        app = Approvals(migrated_url).app
        app.schedule("hourly", "plain", every=timedelta(hours=1), input=7)
        try:
            leader = Supervisor(
                await app_store(app), instance="sup", schedules=list(app.schedule_specs.values())
            )
            await leader.tick()
            transport = httpx.ASGITransport(app=create_app(app, token=TOKEN))
            auth = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(
                transport=transport, base_url="http://127.0.0.1"
            ) as client:
                [listed] = (await client.get("/api/schedules")).json()["schedules"]
                timing = (listed["name"], listed["every"], listed["paused"])
                assert timing == ("hourly", 3600, False)
                assert 'data-schedule="hourly"' in (await client.get("/schedules")).text
                path = "/api/schedules/hourly"
                assert (await client.post(f"{path}/pause")).status_code == 401
                paused = await client.post(f"{path}/pause", headers=auth)
                assert paused.json() == {"name": "hourly", "paused": True, "task_id": None}
                assert (await app.schedules_async())[0].paused
                ran = (await client.post(f"{path}/trigger", headers=auth)).json()
                assert (await app.status_async(ran["task_id"])).input == 7
                missing = await client.post("/api/schedules/nope/resume", headers=auth)
                assert missing.status_code == 404
        finally:
            await app.aclose()

    asyncio.run(scenario())


BOUNDED = "tests.cli.cli_app:bounded"


def test_an_event_beyond_a_bound_is_refused_by_the_command_line_and_the_api(
    migrated_url: str,
) -> None:
    """The command line keeps an event within the bounds it is given, else the application's
    (--app), else the defaults, and refuses one beyond them with one error line naming the
    bound (exit 1); the API answers 413 with an error naming it."""
    app = cli_app.build(migrated_url, max_events_per_task=2, max_event_payload=64)
    asyncio.run(app.submit_async("process", {}, task_id="t"))
    asyncio.run(app.submit_async("process", {}, task_id="u"))
    asyncio.run(app.aclose())

    def send(*args: str, env: dict[str, str] | None = None) -> Result:
        return invoke("--store", migrated_url, *args, env=env)

    for n in (1, 2):
        assert_ok(send("--app", BOUNDED, "send", "t", "vote", str(n)))
    assert_refused(
        send("--app", BOUNDED, "send", "t", "vote", "3"),
        "Error: event 'vote' refused: task 't' keeps 2 events, its max_events_per_task (2)",
        exit_code=1,
    )
    assert_ok(send("--app", BOUNDED, "send", "t", "vote", "3", "--max-events-per-task", "3"))
    assert_ok(send("send", "t", "vote", "4"))  # without --app: the default, 1000
    payload = orjson.dumps("x" * 20).decode()  # 22 bytes
    assert_refused(
        send("send", "u", "vote", payload, env={"STEPWARDEN_MAX_EVENT_PAYLOAD": "21"}),
        "Error: event 'vote' refused: its payload is 22 bytes, over max_event_payload (21)",
        exit_code=1,
    )

    async def through_the_api() -> None:
        web = create_app(cli_app.build(migrated_url, max_events_per_task=4), token=TOKEN)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        transport = httpx.ASGITransport(app=web)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as api:
            full = await api.post("/api/tasks/t/send", json={"name": "vote"}, headers=auth)
            assert full.status_code == 413
            assert full.json() == {
                "error": "event 'vote' refused: task 't' keeps 4 events, "
                "its max_events_per_task (4)"
            }
            big = {"name": "vote", "payload": "x" * 300_000}
            too_big = await api.post("/api/tasks/u/send", json=big, headers=auth)
            assert too_big.status_code == 413
            assert too_big.json() == {
                "error": "event 'vote' refused: its payload is 300002 bytes, over "
                "max_event_payload (262144)"
            }
            fits = await api.post("/api/tasks/u/send", json={"name": "vote"}, headers=auth)
            assert fits.status_code == 200 and fits.json() == {"sent": True, "woke": False}

    asyncio.run(through_the_api())
    assert sql(migrated_url, "SELECT task_id, count(*) FROM stepwarden_inbox GROUP BY task_id "
               "ORDER BY task_id") == [("t", 4), ("u", 1)]  # fmt: skip
