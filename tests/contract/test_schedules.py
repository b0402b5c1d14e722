"""Schedules on each store: declared in code, stored by the supervisor leader, exactly one task
per tick however many supervisors race, the catch-up policies, pause, trigger, and clear
errors for a bad declaration."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import stepwarden as sw
from stepwarden.records import ScheduleSpec
from stepwarden.rules import SKIP_GRACE, first_tick, plan_ticks, schedule_task_id
from stepwarden.supervisor import Supervisor
from tests.rawsql import is_sqlite, seconds_ago, sql
from tests.stores import app_store

from ..support.worker import running


def _app(store_url: str) -> sw.App:
    app = sw.App("sched", store=store_url)
    desk = app.agent("desk")

    @desk.operation
    async def stamp(call: sw.Call, value: Any) -> Any:
        return value

    @app.workflow(complete_within=timedelta(seconds=20))
    async def report(ctx: sw.Context, value: Any) -> Any:
        return await ctx.step(desk.stamp, value)

    return app


def _db_now(store_url: str) -> float:
    """The store's clock, as an epoch."""
    now = seconds_ago(store_url, 0)
    epoch = now if is_sqlite(store_url) else f"extract(epoch FROM {now})"
    [(value,)] = sql(store_url, f"SELECT {epoch}")
    return float(value)


def _spec(**kw: Any) -> ScheduleSpec:
    base: dict[str, Any] = {
        "name": "s",
        "workflow": "report",
        "input": "null",
        "complete_within": 20.0,
        "max_failures": 3,
        "on_failure": "compensate",
        "every": 10.0,
    }
    return ScheduleSpec(**{**base, **kw})


def test_the_catch_up_policies() -> None:
    now = 1_000_000.0
    # Ticks every 10 s due since 100 s ago: 11 of them (the one at `now` included).
    start = now - 100
    every, _ = plan_ticks(_spec(catch_up="all"), start, now)
    assert every == [start + 10 * i for i in range(11)]
    latest, after = plan_ticks(_spec(catch_up="latest"), start, now)
    assert latest == [now] and after == now + 10
    skipped, after = plan_ticks(_spec(catch_up="skip"), start, now)
    assert skipped == [t for t in every if now - t <= SKIP_GRACE] and after == now + 10
    # After an hour without a supervisor: "skip" keeps the last minute's ticks only, "latest"
    # the newest, and neither walks the hour tick by tick.
    secondly = _spec(every=1.0, catch_up="skip")
    recent, after = plan_ticks(secondly, now - 3600, now)
    assert recent == [now - 60 + i for i in range(61)] and after == now + 1
    newest, after = plan_ticks(_spec(every=1.0, catch_up="latest"), now - 3600, now)
    assert newest == [now] and after == now + 1
    nightly = _spec(cron="0 2 * * *", every=None, timezone="Europe/Paris", catch_up="all")
    midnight = datetime(2026, 11, 24, 0, 0, tzinfo=UTC).timestamp()
    [tick], _ = plan_ticks(nightly, first_tick(nightly, midnight), midnight + 86_400)
    assert datetime.fromtimestamp(tick, tz=UTC) == datetime(2026, 11, 24, 1, 0, tzinfo=UTC)
    assert schedule_task_id("s", midnight) == "s@2026-11-24T00:00:00+00:00"


def test_a_bad_declaration_is_refused_with_a_clear_error(tmp_path: Any) -> None:
    app = _app(f"sqlite:///{tmp_path / 'never.db'}")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"cron": "every night"}, "not a cron expression: 'every night'"),
        ({"cron": "0 2 * * *", "every": timedelta(hours=1)}, "give cron or every, one of"),
        ({}, "give cron or every, one of the two"),
        ({"every": timedelta(0)}, "every must be a timedelta or a number of seconds, from 1 to"),
        ({"every": 0.5}, "every must be a timedelta or a number of seconds, from 1 to"),
        ({"every": "60"}, "every must be a timedelta or a number of seconds, from 1 to"),
        ({"cron": "0 2 * * *", "timezone": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
        ({"cron": "0 2 * * *", "catch_up": "some"}, "catch_up must be one of skip, all, latest"),
        ({"cron": "0 0 30 2 *"}, r"cron '0 0 30 2 \*' never fires"),
    ]
    for kwargs, message in cases:
        with pytest.raises(sw.ConfigurationError, match=message):
            app.schedule("nightly", "report", **kwargs)
    with pytest.raises(sw.UnknownNameError):
        app.schedule("nightly", "nope", cron="0 2 * * *")
    app.schedule("nightly", "report", cron="0 2 * * *")
    with pytest.raises(sw.ConfigurationError, match="declared twice"):
        app.schedule("nightly", "report", cron="0 3 * * *")


async def test_racing_supervisors_create_one_task_per_tick(store_url: str) -> None:
    app = _app(store_url)
    app.schedule("often", "report", every=timedelta(seconds=1), input={"n": 1}, catch_up="all")
    store = await app_store(app)
    try:
        specs = list(app.schedule_specs.values())
        supervisors = [
            Supervisor(store, instance=f"sup-{i}", interval=0.05, lease_ttl=0.3, schedules=specs)
            for i in range(3)
        ]
        deadline = asyncio.get_running_loop().time() + 3.5
        while asyncio.get_running_loop().time() < deadline:
            await asyncio.gather(*(s.tick() for s in supervisors))
            await asyncio.sleep(0.05)
            # The lease changes hands now and then: each new leader must not repeat a tick.
            earlier = "expires_at - 1" if is_sqlite(store_url) else "expires_at - interval '1 s'"
            sql(store_url, f"UPDATE stepwarden_leases SET expires_at = {earlier}")
        tasks = [t for t in await app.tasks_async(limit=100) if t.task_id.startswith("often@")]
        ids = [t.task_id for t in tasks]
        assert len(ids) >= 3 and len(set(ids)) == len(ids)
        ticks = sorted(datetime.fromisoformat(i.split("@", 1)[1]) for i in ids)
        assert all((b - a) == timedelta(seconds=1) for a, b in itertools.pairwise(ticks))
        [stored] = await app.schedules_async()
        assert stored.last_tick == ticks[-1] and stored.next_at == ticks[-1] + timedelta(seconds=1)
    finally:
        await app.aclose()


async def test_a_schedule_runs_its_workflow_and_can_be_paused_and_triggered(
    store_url: str,
) -> None:
    app = _app(store_url)
    app.schedule("tick", "report", every=timedelta(seconds=1), input="hello")

    async def created() -> list[str]:
        found = await app.tasks_async(limit=100)
        return [t.task_id for t in found if t.task_id.startswith("tick@")]

    try:
        async with running(app):
            async with asyncio.timeout(20):
                while True:
                    found = await created()
                    if found:
                        break
                    await asyncio.sleep(0.05)
            assert await app.result_async(found[0], timeout=20) == "hello"
        # Paused, its ticks make no task, however late they are; resumed, the ticks of the
        # pause are never made: it goes on from its first tick after the resume.
        store = await app_store(app)
        leader = Supervisor(
            store, instance="sup", lease_ttl=30, schedules=list(app.schedule_specs.values())
        )
        await app.pause_schedule_async("tick")
        [paused] = await app.schedules_async()
        assert paused.paused
        before = set(await created())
        past = "next_at - 3600" if is_sqlite(store_url) else "next_at - interval '1 hour'"
        sql(store_url, f"UPDATE stepwarden_schedules SET next_at = {past}")
        await leader.tick()
        assert set(await created()) == before
        resumed_at = _db_now(store_url)
        await app.pause_schedule_async("tick", paused=False)
        [resumed] = await app.schedules_async()
        assert not resumed.paused and resumed.next_at.timestamp() > resumed_at
        await leader.tick()
        assert set(await created()) == before  # not one task for the hour paused
        async with asyncio.timeout(20):
            while not set(await created()) - before:
                await leader.tick()
                await asyncio.sleep(0.05)
        made = set(await created()) - before  # one tick or more, on a busy machine
        for new in made:  # each after the resume: none of the hour paused
            assert datetime.fromisoformat(new.split("@", 1)[1]).timestamp() > resumed_at
        triggered = await app.trigger_schedule_async("tick")
        assert triggered.startswith("tick@now-")
        assert (await app.status_async(triggered)).input == "hello"
        with pytest.raises(sw.UnknownNameError):
            await app.pause_schedule_async("nope")
    finally:
        await app.aclose()


async def test_one_bad_schedule_never_stops_the_others(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A cron expression that never fires, from a declaration that skipped App.schedule or
    stored by an older stepwarden that did not refuse it: the other schedules are stored and
    tick; the bad one is not stored, or is set aside (paused) with an error logged."""
    app = _app(store_url)
    app.schedule("good", "report", every=timedelta(seconds=1), input="ok", catch_up="latest")
    app.schedule("later", "report", every=timedelta(seconds=1), catch_up="latest")
    never = _spec(name="never", every=None, cron="0 0 30 2 *")
    store = await app_store(app)
    try:
        specs = [never, *app.schedule_specs.values()]
        leader = Supervisor(store, instance="sup", lease_ttl=30, schedules=specs)
        await leader.tick()
        assert sorted(s.name for s in await app.schedules_async()) == ["good", "later"]
        assert "schedule never: not stored: schedule 'never': cron '0 0 30 2 *' never fires" in (
            caplog.text
        )
        # What the first tick made (on a busy machine, a second may pass between storing a
        # schedule and working out its ticks: "later" may have ticked then, before it was bad).
        before = {t.task_id for t in await app.tasks_async(limit=100)}
        # "later" stored by an older stepwarden with a cron that never fires, its tick due.
        past = "next_at - 3600" if is_sqlite(store_url) else "next_at - interval '1 hour'"
        sql(
            store_url,
            f"UPDATE stepwarden_schedules SET cron = '0 0 30 2 *', every = NULL,"
            f" next_at = {past} WHERE name = 'later'",
        )
        sql(store_url, f"UPDATE stepwarden_schedules SET next_at = {past} WHERE name = 'good'")
        await leader.tick()
        made = {t.task_id for t in await app.tasks_async(limit=100)} - before
        assert made and {i.split("@")[0] for i in made} == {"good"}
        stored = {s.name: s for s in await app.schedules_async()}
        assert stored["later"].paused and not stored["good"].paused
        assert "schedule later: paused, its ticks cannot be worked out" in caplog.text
        # Set aside, it stays so: resuming it is refused with the same reason.
        with pytest.raises(sw.ConfigurationError, match="never fires"):
            await app.pause_schedule_async("later", paused=False)
        assert {s.name: s.paused for s in await app.schedules_async()}["later"]
    finally:
        await app.aclose()
