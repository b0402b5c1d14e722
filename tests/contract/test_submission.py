"""One submission, one answer, on each store: a submit is created; under a taken task id it is
the same submit (same workflow, version, input and client: the task is left as it is, the
re-submit's other options ignored) or a conflict, which `App.submit`, `submit_async` and
`TaskTransaction.submit` raise as SubmitConflict, naming the task and what differs, and
after which nothing was written."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

import stepwarden as sw
from stepwarden import sealing
from stepwarden.states import TaskState

from ..support.apps import keyring

WITHIN = timedelta(seconds=30)


def build(store_url: str, keys: sw.Keyring | None = None) -> sw.App:
    app = sw.App("submission", store=store_url, keys=keys)

    @app.workflow(complete_within=WITHIN)
    async def order(ctx: sw.Context, n: object) -> object:
        return n

    @app.workflow(name="order", complete_within=WITHIN, version=2)
    async def order_v2(ctx: sw.Context, n: object) -> object:
        return n

    @app.workflow(name="refund", complete_within=WITHIN)
    async def refund(ctx: sw.Context, n: object) -> object:
        return n

    return app


@pytest.fixture
async def app(store_url: str) -> AsyncIterator[sw.App]:
    a = build(store_url)
    async with a:
        yield a


async def test_a_resubmit_is_created_then_the_same(app: sw.App) -> None:
    first = await app.submit_async("order", {"n": 1}, task_id="o-1")
    assert first == "o-1"
    # The same submit again, its object's keys in another order, its other options changed:
    # the id, and the task as the first submit made it.
    start = timedelta(hours=1)
    again = await app.submit_async(
        "order", {"n": 1}, task_id="o-1", priority=9, reply_to="news", start_after=start
    )
    assert again == "o-1"
    task = await app.status_async("o-1")
    assert (task.priority, task.reply_to, task.process_state) == (0, None, TaskState.PENDING)
    assert task.input == {"n": 1} and task.version == 2
    [answer] = await app.submit_many_async([app.new_task("order", {"n": 1}, task_id="o-1")])
    assert (answer.outcome, answer.differs, answer.created) == ("same", (), False)
    status = await app.task_status_async("o-1")
    assert isinstance(status, sw.TaskStatus)
    assert (status.task_id, status.workflow, status.version) == ("o-1", "order", 2)
    assert (status.state, status.finished, status.priority) == (TaskState.PENDING, False, 0)
    assert await asyncio.to_thread(app.task_status, "o-1") == status
    assert len(await app.tasks_async()) == 1


@pytest.mark.parametrize(
    ("change", "differs", "told"),
    [
        ({"input": {"n": 2}}, ("input",), "another input"),
        (
            {"workflow": "refund"},
            ("workflow", "version"),
            "workflow 'order' (this submit: 'refund'), version 2 (this submit: 1)",
        ),
        ({"version": 1}, ("version",), "version 2 (this submit: 1)"),
    ],
)
async def test_a_resubmit_that_differs_raises_naming_the_task_and_what_differs(
    app: sw.App, change: dict[str, Any], differs: tuple[str, ...], told: str
) -> None:
    await app.submit_async("order", {"n": 1}, task_id="o-1")
    asked: dict[str, Any] = {"workflow": "order", "input": {"n": 1}, "version": None, **change}
    workflow, value, version = asked["workflow"], asked["input"], asked["version"]
    message = f"task 'o-1' was submitted before with {told}: a task id names one submit"
    with pytest.raises(sw.SubmitConflict) as raised:
        await app.submit_async(workflow, value, task_id="o-1", version=version)
    assert str(raised.value) == message
    assert (raised.value.task_id, raised.value.differs) == ("o-1", differs)
    assert isinstance(raised.value, sw.StepwardenError)
    # The blocking form and a submit in the application's transaction raise it alike; the
    # batch form answers it.
    with pytest.raises(sw.SubmitConflict, match=re.escape(message)):
        await asyncio.to_thread(app.submit, workflow, value, task_id="o-1", version=version)
    with pytest.raises(sw.SubmitConflict, match=re.escape(message)):
        async with app.transaction() as tx:
            await tx.submit(workflow, value, task_id="o-1", version=version)
    [answer] = await app.submit_many_async(
        [app.new_task(workflow, value, task_id="o-1", version=version)]
    )
    assert (answer.outcome, answer.differs) == ("conflict", differs)
    # Nothing was written: the task is the first submit's.
    [task] = await app.tasks_async()
    assert (task.task_id, task.workflow, task.version, task.input) == ("o-1", "order", 2, {"n": 1})


async def test_a_task_another_client_submitted_is_a_conflict_whatever_its_input(
    app: sw.App,
) -> None:
    """A task the application API's client submitted is not the same submit as one made in
    Python, even with its workflow and input: nothing else of it is compared."""
    [made] = await app.submit_many_async(
        [app.new_task("order", {"n": 1}, task_id="o-1", submitted_by="billing")]
    )
    assert made.created
    with pytest.raises(sw.SubmitConflict) as raised:
        await app.submit_async("order", {"n": 1}, task_id="o-1")
    assert raised.value.differs == ("client",)
    assert str(raised.value) == (
        "task 'o-1' exists, submitted by another client: a task id names one submit (leave "
        "task_id out for a new one)"
    )
    [same] = await app.submit_many_async(
        [app.new_task("order", {"n": 1}, task_id="o-1", submitted_by="billing")]
    )
    assert same.outcome == "same"


async def test_a_resubmit_is_the_same_across_a_rotation_of_the_digest_key(store_url: str) -> None:
    """The input digest is keyed: a re-submit made under a new digest key is compared with
    the stored digest under its own key, still in the keyring."""
    keys: dict[str, str] = {}
    old = keyring("k1", keys=keys)
    async with build(store_url, old) as app:
        await app.submit_async("order", {"n": sw.Secret("7391")}, task_id="o-1")
    d2 = sealing.new_key()
    rotated = sw.Keyring.parse(f"digest d1 {keys['d1']}\ndigest d2 {d2}\nseal k1 {keys['k1']}")
    assert rotated.digest_current == "d2"
    async with build(store_url, rotated) as app:
        secret = sw.Secret("7391")
        assert await app.submit_async("order", {"n": secret}, task_id="o-1") == "o-1"
        with pytest.raises(sw.SubmitConflict, match="another input"):
            await app.submit_async("order", {"n": sw.Secret("0000")}, task_id="o-1")


@pytest.mark.parametrize(
    "value", [{"$secret": "PIN-7391", "extra": 1}, {"$sealed": "k1:AAAA"}], ids=["beside", "sealed"]
)
async def test_an_object_with_a_reserved_key_is_refused_in_python_too(
    app: sw.App, value: dict[str, Any]
) -> None:
    """An input of an App's own (not read from a request) holding `{"$secret": ..., "extra":
    ...}` would be stored as a plain object, its value shown wherever the input is; and a
    `{"$sealed": ...}` of its own is the store's to write: each is refused with an error that
    says why and shows no value, and nothing is stored."""
    with pytest.raises(sw.PayloadError, match="reserved key") as raised:
        await app.submit_async("order", {"id": 1, "pin": value}, task_id="o-1")
    assert "PIN-7391" not in str(raised.value)
    with pytest.raises(sw.PayloadError, match="reserved key"):  # however deep it is
        app.new_task("order", [{"n": [value]}], task_id="o-2")
    assert await app.tasks_async() == []
