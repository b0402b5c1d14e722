"""An agent instance whose circuit breaker opens hands back the request it holds, even when
the failure that opened it was the request's last try: another instance may reach the
service, and the step does not wait for its complete_by.

Run by one worker with every role, and by two (`workers`): the scheduler and the supervisor
in one, the agent in another that serves it over HTTP, whose hand-back and breaker event
go through the server's agent protocol."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import stepwarden as sw

from ..agentserver import Workers
from ..support.poll import until
from ..support.worker import FAST


async def test_the_try_that_opens_the_breaker_hands_its_request_back(
    store_url: str, workers: Workers
) -> None:
    app = sw.App("edge", store=store_url)
    edge = app.agent(
        "edge",
        retry=sw.Retry(max_attempts=2, initial=0.001, maximum=0.001),
        breaker=sw.Breaker(failures=2, reset_after=60),
    )
    tries = 0

    @edge.operation
    async def call(c: sw.Call, x: Any) -> None:
        nonlocal tries
        tries += 1
        raise ConnectionError("the service is down")

    @app.workflow(complete_within=timedelta(seconds=60), max_failures=3)
    async def once(ctx: sw.Context, x: Any) -> Any:
        return await ctx.step(edge.call, x)

    task_id = await app.submit_async(once, 1)
    store = await app.store()

    async def handed_back() -> bool:
        return bool(await store.events(task_id=task_id, kind="handed_back"))

    async with workers(app, dataclasses.replace(FAST, drain_timeout=0.5)):
        await until(handed_back)
    assert tries == 2  # the last try opened the breaker; nothing more was tried here
    [back] = await store.events(task_id=task_id, kind="handed_back")
    assert "open" in back.detail["reason"]
    # The breaker's opening is in the history, recorded at a heartbeat or by the drain.
    opened = await store.events(kind="breaker")
    assert {(e.detail["agent"], e.detail["state"]) for e in opened} == {("edge", "open")}
    [step] = await store.get_steps(task_id)
    assert step.state == sw.StepState.NOT_STARTED and step.reassignments == 1
    assert await store.events(task_id=task_id, kind="expired") == []
    await app.aclose()
