"""`stepwarden why TASK` on both stores: what holds a task and each of its open steps, from
the store (and, with --app, the App's operation limits), as text and as JSON."""

from __future__ import annotations

import asyncio

import orjson

import stepwarden as sw
from stepwarden.records import SchedulerBeat

from ..support.store import whole_store
from ..support.why import ROLES, until
from ..support.worker import running
from . import cli_app
from .helpers import APP, assert_ok, assert_refused, invoke


def test_why_says_what_holds_a_task_and_its_steps(migrated_url: str) -> None:
    url = migrated_url
    assert_ok(invoke("--store", url, "submit", "process", "{}", "--task-id", "later",
                     "--start-after", "3600", "--app", APP))  # fmt: skip
    later = assert_ok(invoke("--store", url, "why", "later"))
    assert "state    waiting" in later and "waits    [start] its delayed start at 20" in later
    data = orjson.loads(assert_ok(invoke("--store", url, "why", "later", "--json")))
    assert data["gate"]["reason"] == "start" and data["gate"]["until"].startswith("20")
    assert data["holding"] == data["gate"] and data["steps"] == []

    assert_ok(invoke("--store", url, "submit", "process", "{}", "--task-id", "idle",
                     "--app", APP))  # fmt: skip
    idle = assert_ok(invoke("--store", url, "why", "idle"))
    assert "[no_scheduler] a scheduler of process version 1: none alive" in idle
    assert_ok(invoke("--store", url, "pause", "idle", "--by", "ann", "--reason", "a look"))
    paused = assert_ok(invoke("--store", url, "why", "idle"))
    assert "[paused] an operator: paused by ann at 20" in paused and "(a look)" in paused

    async def a_step_with_no_agent() -> None:
        app = cli_app.build(url)
        try:
            await app.submit_async("process", {"n": 1}, task_id="stuck")
            async with running(app, ROLES["no_agents"]):
                await until("the queued step", lambda: _no_agent(app, "stuck"))
                shown = await asyncio.to_thread(invoke, "--store", url, "why", "stuck")
            text = assert_ok(shown)
            assert "state    processing" in text
            assert "waits    [no_agent] an instance of agent desk serving stamp" in text
            assert "task     [held] scheduler-" in text
            assert "stamp (desk.stamp, not_started)\n           [no_agent]" in text
        finally:
            await app.aclose()

    asyncio.run(a_step_with_no_agent())

    refused = invoke("--store", url, "why", "no-such-task")
    assert_refused(refused, "no task 'no-such-task'", exit_code=1)
    assert_refused(invoke("--store", url, "why", "bad\nid"), "task_id", exit_code=1)


async def _no_agent(app: sw.App, task_id: str) -> bool:
    why = await app.why_async(task_id)
    return why.holding.reason == sw.WaitReason.NO_AGENT


def test_why_says_a_ranked_task_s_place_in_its_tenant_and_its_tenant_s_share(
    migrated_url: str,
) -> None:
    url = migrated_url

    async def two_tenants_waiting() -> None:
        app = cli_app.build(url)
        try:
            for n, tenant in enumerate(("acme", "globex", "acme")):
                await app.submit_async("process", {"n": n}, task_id=f"t{n}", tenant=tenant)
            beat = SchedulerBeat(
                instance="sched-1",
                workflows=("process",),
                capacity=10,
                held=0,
                versions=(("process", 1),),
            )
            async with whole_store(url) as store:
                await store.beat_schedulers([beat], ttl=60)
        finally:
            await app.aclose()

    asyncio.run(two_tenants_waiting())
    assert_ok(invoke("--store", url, "tenants", "weight", "acme", "3"))
    text = assert_ok(invoke("--store", url, "why", "t2"))
    assert (
        "[ranked] its turn: rank 3, behind 2 (1 of tenant acme, whose share of the claims is "
        "75%), for sched-1" in text
    ), text
    gate = orjson.loads(assert_ok(invoke("--store", url, "why", "t1", "--json")))["gate"]
    assert (gate["tenant"], gate["ahead"], gate["tenant_ahead"], gate["share"]) == (
        "globex",
        1,
        0,
        0.25,
    )
