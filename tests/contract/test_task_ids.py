"""A `TaskId` (what submit returns, typed by its workflow's result) is a `str` to everything
at run time, on each store: equal to and hashed as the plain string, serialised as it, bound
as a query parameter, and read back from the store as a plain str equal to it. The typed
shop of `tests/typed/typed_shop.py` runs here as it is type-checked there."""

from __future__ import annotations

import asyncio
import copy
import json
import pickle
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

import stepwarden as sw
from tests.typed.typed_shop import Order, Shop, build, submit_and_wait

from ..support.worker import running

ORDER: Order = {"id": 42, "items": ["book", "pen"]}


def expected(order: Order, task_id: str) -> dict[str, Any]:
    """What process_order returns for `order` run as the task `task_id`."""
    return {
        "receipt": {"order": order["id"], "key": f"{task_id}/2"},
        "parcels": [f"{item}x1" for item in order["items"]],
        "checked": 0,
        "again": True,
        "by_name": len("by name"),
        "mixed": ["ax2", 0],
    }


@pytest.fixture
async def shop(store_url: str) -> AsyncIterator[Shop]:
    s = build(store_url)
    async with s.app:  # closes the blocking calls' store and thread too
        yield s


async def test_a_task_id_is_a_str_through_the_store(shop: Shop) -> None:
    app = shop.app
    async with running(app):
        task_id = await app.submit_async(shop.process_order, ORDER, task_id="order-42")
        assert type(task_id) is sw.TaskId and isinstance(task_id, str)
        # Equal to, hashed, shown and serialised as the plain string.
        assert task_id == "order-42" and task_id in {"order-42"}
        assert hash(task_id) == hash("order-42") and {task_id: 1} == {"order-42": 1}
        assert repr(task_id) == "'order-42'" and f"{task_id}" == "order-42"
        assert type(str(task_id)) is str and task_id + "!" == "order-42!"
        assert json.dumps({"id": task_id}) == '{"id": "order-42"}'
        assert orjson.dumps({"id": task_id}) == orjson.dumps({"id": "order-42"})
        assert pickle.loads(pickle.dumps(task_id)) == "order-42"
        assert copy.deepcopy(task_id) == "order-42"

        result = await app.result_async(task_id, timeout=60)
        assert result == expected(ORDER, "order-42")
        # The store gives the id back as a plain str, equal to the TaskId.
        status = await app.status_async(task_id)
        assert status.task_id == task_id and type(status.task_id) is str
        assert status.process_state == sw.TaskState.PROCESSED and status.result == result
        assert "order-42" in {t.task_id for t in await app.tasks_async()}
        view = await app.show_async(task_id)
        assert [s.state for s in view.steps][:2] == [sw.StepState.COMPLETED] * 2
        children = {c.task_id for c in view.children}
        assert children == {"pack-42", "order-42:4", "order-42:6", "order-42:7.2.1"}
        # A plain string names the same task; the TaskId names it as a task_id too.
        assert await app.result_async("order-42") == result
        again = await app.submit_async(shop.process_order, ORDER, task_id=task_id)
        assert again == task_id and len(await app.tasks_async()) == 1 + len(children)
        # As the JSON input of another task (the workflow takes a str).
        audit = await app.submit_async(shop.audit, task_id, task_id=sw.TaskId("audit-42"))
        assert await app.result_async(audit, timeout=60) == len("order-42")
        assert (await app.status_async("audit-42")).input == "order-42"


async def test_submit_in_a_transaction_returns_a_task_id(shop: Shop) -> None:
    app = shop.app
    async with running(app):
        async with app.transaction() as tx:
            task_id = await tx.submit(shop.pack_all, ["cup"], task_id="pack-cup")
        assert type(task_id) is sw.TaskId and task_id == "pack-cup"
        assert await app.result_async(task_id, timeout=60) == ["cupx1"]
        assert (await app.status_async("pack-cup")).task_id == "pack-cup"


async def test_the_blocking_forms_return_and_take_a_task_id(shop: Shop) -> None:
    order: Order = {"id": 7, "items": ["lamp"]}
    async with running(shop.app):
        # submit and result from another thread, as blocking code calls them
        result = await asyncio.to_thread(submit_and_wait, shop, order)
    [task] = [t for t in await shop.app.tasks_async() if t.workflow == "process_order"]
    assert result == expected(order, task.task_id)
