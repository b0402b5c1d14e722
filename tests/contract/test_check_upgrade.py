"""`upgrade.check` on each store: tasks left in flight by one release of the code (parallel
branches standing at their second steps, a task waiting for an event) replayed by the next
release, read-only. The replay is the engine's own, so what it finds is what a resumed task
would meet: a divergence in one branch while the other stands, a wait of another kind, an
operation the new code does not declare."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import stepwarden as sw
from stepwarden import upgrade
from stepwarden.sealing import Keyring, new_keyring
from stepwarden.store import open_one

from ..support.poll import until
from ..support.worker import FAST, running

# Only the agent `svc` runs: the steps of `slow` stay recorded and open.
ONLY_SVC = dataclasses.replace(FAST, agents=frozenset({"svc"}))


def release(store_url: str, change: str = "") -> sw.App:
    """One release of the code. `change`: "second_branch" (the second branch of `fan`
    starts with another step), "sleeps" (`approve` sleeps where it waited for an event),
    "ghost" (`approve` starts with an operation no agent of the App declares), "returns"
    (`approve` returns where it waited)."""
    app = sw.App("shop", store=store_url)
    svc, slow = app.agent("svc"), app.agent("slow")
    ghost = sw.App("other", store=store_url).agent("ghost")

    @svc.operation
    async def a(call: sw.Call, n: int) -> int:
        return n + 1

    @svc.operation
    async def b(call: sw.Call, n: int) -> int:
        return n + 2

    @svc.operation
    async def e(call: sw.Call, n: int) -> int:
        return n + 5

    @slow.operation
    async def c(call: sw.Call, n: int) -> int:
        return n

    @ghost.operation
    async def haunt(call: sw.Call, n: int) -> int:
        return n

    async def branch(ctx: sw.Context, first: Any, n: int) -> int:
        return await ctx.step(c, await ctx.step(first, n))

    @app.workflow(complete_within=timedelta(seconds=30))
    async def fan(ctx: sw.Context, n: int) -> list[int]:
        second = e if change == "second_branch" else b
        return await ctx.gather(branch(ctx, a, n), branch(ctx, second, n))

    @app.workflow(complete_within=timedelta(seconds=30))
    async def approve(ctx: sw.Context, n: int) -> Any:
        first = await ctx.step(haunt if change == "ghost" else a, n)
        if change == "sleeps":
            await ctx.sleep(60)
            return first
        if change == "returns":
            return first
        return await ctx.wait_for_event("go", timeout=3600)

    return app


async def _recorded(store_url: str) -> list[upgrade.InFlight]:
    """What the first release leaves in flight: `fan` with both branches at their `c`
    (recorded, no agent to take it), `approve` waiting for its event."""
    old = release(store_url)
    store = open_one(store_url)
    await store.open(migrate=True)
    try:
        async with running(old, ONLY_SVC):
            await old.submit_async("fan", 1, task_id="fan-1")
            await old.submit_async("approve", 1, task_id="approve-1")

            async def standing() -> bool:
                fan = await store.get_steps("fan-1")
                approve = await store.get_task("approve-1")
                return len(fan) == 4 and approve is not None and approve.waiting_for == "event:go"

            await until(standing)
    finally:
        await old.aclose()
        await store.close()
    reader = open_one(store_url, read_only=True)
    await reader.open(migrate=False)
    try:
        return await upgrade.in_flight(reader)
    finally:
        await reader.close()


def _outcomes(report: upgrade.Report) -> dict[str, upgrade.TaskCheck]:
    return {t.task_id: t for t in report.tasks}


def _check(app: sw.App) -> Callable[[list[upgrade.InFlight]], Awaitable[upgrade.Report]]:
    operations = {op.qualname: op for ag in app.agents.values() for op in ag.operations.values()}
    return lambda tasks: upgrade.check(tasks, app.workflow_versions, operations)


async def test_the_same_code_replays_up_to_where_each_task_stands(store_url: str) -> None:
    tasks = await _recorded(store_url)
    assert {t.task.task_id for t in tasks} == {"fan-1", "approve-1"}
    report = await _check(release(store_url))(tasks)
    assert (report.ok, report.checked, report.breaking) == (True, 2, 0)
    found = _outcomes(report)
    assert found["fan-1"].outcome == upgrade.Outcome.REPLAYS
    assert found["fan-1"].position in ("1.1.2", "1.2.2")  # a branch's `c`, under way
    approve = found["approve-1"]
    assert (approve.outcome, approve.position) == (upgrade.Outcome.REPLAYS, "2")
    assert approve.message == "stands at a wait for event 'go', open"


async def test_a_divergence_in_one_branch_is_found_while_the_other_stands(
    store_url: str,
) -> None:
    tasks = await _recorded(store_url)
    fan = _outcomes(await _check(release(store_url, "second_branch"))(tasks))["fan-1"]
    assert (fan.outcome, fan.breaks, fan.position) == (upgrade.Outcome.DIVERGES, True, "1.2.1")
    assert (fan.recorded, fan.asked) == ("step 'svc.b' (svc.b)", "step 'svc.e' (svc.e)")


async def test_a_wait_of_another_kind_diverges_and_an_undeclared_operation_raises(
    store_url: str,
) -> None:
    tasks = await _recorded(store_url)
    sleeps = _outcomes(await _check(release(store_url, "sleeps"))(tasks))["approve-1"]
    assert (sleeps.outcome, sleeps.position) == (upgrade.Outcome.DIVERGES, "2")
    assert (sleeps.recorded, sleeps.asked) == ("a wait for event 'go'", "a timer")
    # Returning before a recorded wait is no error of a run, but a divergence all the same.
    returns = _outcomes(await _check(release(store_url, "returns"))(tasks))["approve-1"]
    assert (returns.outcome, returns.breaks, returns.position) == (
        upgrade.Outcome.DIVERGES,
        True,
        "2",
    )
    assert (returns.asked, returns.recorded) == ("its end", "a wait for event 'go'")
    report = await _check(release(store_url, "ghost"))(tasks)
    ghost = _outcomes(report)["approve-1"]
    assert (ghost.outcome, ghost.breaks) == (upgrade.Outcome.RAISES, True)
    assert "operation 'ghost.haunt' is not one of the App's agents' operations" in (
        ghost.message or ""
    )
    assert _outcomes(report)["fan-1"].outcome == upgrade.Outcome.REPLAYS
    summary = {(s.workflow, s.version): s.counts for s in report.summary}
    assert summary[("approve", 1)]["raises"] == 1 and summary[("fan", 1)]["replays"] == 1


async def test_a_workflow_that_reveals_a_sealed_secret_is_not_checked_without_the_key(
    store_url: str,
) -> None:
    text = ";".join(line for line in new_keyring().splitlines() if not line.startswith("#"))
    keys = Keyring.parse(text)

    def sealing_release() -> sw.App:
        app = sw.App("vault", store=store_url, keys=keys)
        slow = app.agent("slow")

        @slow.operation
        async def c(call: sw.Call, n: int) -> int:
            return n

        @app.workflow(complete_within=timedelta(seconds=30))
        async def pay(ctx: sw.Context, order: dict[str, Any]) -> int:
            digits = order["card"].reveal()  # the workflow itself needs the secret
            return await ctx.step(c, len(digits))

        return app

    old = sealing_release()
    store = open_one(store_url, keys=keys)
    await store.open(migrate=True)
    try:
        async with running(old, dataclasses.replace(FAST, agents=frozenset())):
            card = sw.Secret("4111 1111 1111 1111")
            await old.submit_async("pay", {"card": card}, task_id="pay-1")
            await until(lambda: _has_steps(store, "pay-1", 1))
    finally:
        await old.aclose()
        await store.close()

    async def read(with_keys: Keyring | None) -> list[upgrade.InFlight]:
        reader = open_one(store_url, keys=with_keys, read_only=True)
        await reader.open(migrate=False)
        try:
            return await upgrade.in_flight(reader)
        finally:
            await reader.close()

    new = sealing_release()
    operations = {op.qualname: op for ag in new.agents.values() for op in ag.operations.values()}
    sealed = await read(None)
    blind = await upgrade.check(sealed, new.workflow_versions, operations, None)
    [task] = blind.tasks
    assert (task.outcome, task.breaks, task.sealed, blind.masked) == (
        upgrade.Outcome.NOT_CHECKED,
        False,
        True,
        1,
    )
    assert "reveals a sealed secret" in (task.message or "")
    # The export keeps it sealed; with the key, the file's task replays as the store's does.
    document, masked = upgrade.export(sealed, source="test", now=datetime.now(UTC))
    assert masked == 0 and b"4111" not in document and b'"$sealed"' in document
    loaded, _ = upgrade.load(document, keys)
    for tasks in (await read(keys), loaded):
        report = await upgrade.check(tasks, new.workflow_versions, operations, keys)
        assert [(t.outcome, t.position, t.sealed) for t in report.tasks] == [
            (upgrade.Outcome.REPLAYS, "1", False)
        ]


async def _has_steps(store: Any, task_id: str, count: int) -> bool:
    return len(await store.get_steps(task_id)) == count


async def test_a_compensating_task_replays_its_compensation(store_url: str) -> None:
    def saga() -> sw.App:
        app = sw.App("saga", store=store_url)
        svc, slow = app.agent("svc"), app.agent("slow")

        @svc.operation
        async def book(call: sw.Call, n: int) -> int:
            return n

        @svc.operation
        async def pay(call: sw.Call, n: int) -> int:
            raise sw.PermanentError("declined")

        @slow.operation
        async def unbook(call: sw.Call, n: int) -> None:
            return None

        @app.workflow(complete_within=timedelta(seconds=30))
        async def trip(ctx: sw.Context, n: int) -> int:
            await ctx.step(book, n, compensate=unbook)
            return await ctx.step(pay, n)

        return app

    old = saga()
    store = open_one(store_url)
    await store.open(migrate=True)
    try:
        async with running(old, ONLY_SVC):
            await old.submit_async("trip", 1, task_id="trip-1")
            await until(lambda: _has_steps(store, "trip-1", 3))  # book, pay, and the undo
    finally:
        await old.aclose()
        await store.close()
    reader = open_one(store_url, read_only=True)
    await reader.open(migrate=False)
    try:
        tasks = await upgrade.in_flight(reader)
    finally:
        await reader.close()
    [task] = tasks
    assert task.task.process_state == sw.TaskState.COMPENSATING
    [check] = (await _check(saga())(tasks)).tasks
    assert (check.outcome, check.state, check.breaks) == (
        upgrade.Outcome.REPLAYS,
        "compensating",
        False,
    )
    assert (check.position, check.message) == (
        None,
        "stands at step 'compensate svc.book', under way",
    )


async def test_a_replay_that_never_stands_still_is_not_checked(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """New code that awaits something of its own (not a step or a wait) is reported as not
    checked once REPLAY_WITHIN has passed, never as passing."""
    monkeypatch.setattr(upgrade, "REPLAY_WITHIN", 0.3)
    app = sw.App("idle", store=store_url)
    never = asyncio.Event()

    @app.workflow(complete_within=timedelta(seconds=30))
    async def stuck(ctx: sw.Context, n: int) -> int:
        await never.wait()
        return n

    try:
        await app.submit_async("stuck", 1, task_id="stuck-1")  # pending: no worker runs
    finally:
        await app.aclose()
    reader = open_one(store_url, read_only=True)
    await reader.open(migrate=False)
    try:
        tasks = await upgrade.in_flight(reader)
    finally:
        await reader.close()
    [check] = (await upgrade.check(tasks, app.workflow_versions)).tasks
    assert (check.outcome, check.state, check.breaks) == (
        upgrade.Outcome.NOT_CHECKED,
        "pending",
        False,
    )
    assert check.message == "the replay did not stand still within 0.3 s"
