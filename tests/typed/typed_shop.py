"""A shop written for the type checker: every step's arguments and result, every task's input
and result are typed from the declarations (the operations' and workflows' own annotations).

`tests/typed/test_mypy.py` runs mypy (strict) on it and expects no error; the project's own
mypy run checks it too. `tests/contract/test_task_ids.py` runs it on each store. Its results
are assigned to annotated variables as a user writes them, and `assert_type` pins what is
inferred: a result inferred as Any where a type is declared is an error here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypedDict, assert_type

import stepwarden as sw


class Order(TypedDict):
    id: int
    items: list[str]


class Receipt(TypedDict):
    order: int
    key: str


@dataclass
class Shop:
    """What `build` declares, with the types the decorators gave them."""

    app: sw.App
    process_order: Callable[[sw.Context, Order], Awaitable[dict[str, Any]]]
    pack_all: Callable[[sw.Context, list[str]], Awaitable[list[str]]]
    audit: Callable[[sw.Context, str | None], Awaitable[int]]


def build(store_url: str) -> Shop:
    """The App, its agents, operations and workflows, on the store at `store_url`."""
    app = sw.App("typed-shop", store=store_url)
    inventory = app.agent("inventory")
    payments = app.agent("payments")
    warehouse = app.agent("warehouse")

    @inventory.operation
    async def reserve(call: sw.Call, order: Order) -> list[str]:
        return order["items"]

    @inventory.operation
    def release(call: sw.Call, order: Order) -> None:  # a sync operation: runs in a thread
        return None

    @payments.operation(retry=sw.Retry(max_attempts=3, initial=0.01, maximum=0.1))
    async def charge(call: sw.Call, order: Order) -> Receipt:
        return {"order": order["id"], "key": call.idempotency_key}

    @warehouse.operation(name="pack")
    def pack_item(call: sw.Call, item: str, size: int) -> str:
        return f"{item}x{size}"

    @app.workflow(complete_within=timedelta(seconds=30))
    async def pack_all(ctx: sw.Context, items: list[str]) -> list[str]:
        # Branches of one type: the gather's list has it.
        parcels = await ctx.gather(*(ctx.step(pack_item, i, 1) for i in items))
        return assert_type(parcels, list[str])

    @app.workflow
    async def audit(ctx: sw.Context, note: str | None = None) -> int:
        return 0 if note is None else len(note)

    @app.workflow(complete_within=timedelta(seconds=30))
    async def process_order(ctx: sw.Context, order: Order) -> dict[str, Any]:
        reserved = await ctx.step(reserve, order, compensate=release)
        assert_type(reserved, list[str])
        receipt: Receipt = await ctx.step(
            charge,
            order,
            complete_within=timedelta(seconds=5),
            name="charge the card",
            pickup_within=timedelta(seconds=20),
            total_within=timedelta(seconds=25),
        )
        assert_type(receipt, Receipt)
        parcels: list[str] = await ctx.child(pack_all, reserved, task_id=f"pack-{order['id']}")
        checked: int = await ctx.child(audit)
        assert_type(parcels, list[str])
        assert_type(checked, int)
        # By name, or through the agent's attribute: the types are not known (Any).
        looked_up = await ctx.step(inventory.reserve, order)
        by_name = await ctx.child("audit", "by name")
        assert_type(looked_up, Any)
        assert_type(by_name, Any)
        mixed: list[Any] = await ctx.gather(ctx.step(pack_item, "a", 2), ctx.child(audit))
        return {
            "receipt": receipt,
            "parcels": parcels,
            "checked": checked,
            "again": looked_up == reserved,
            "by_name": by_name,
            "mixed": mixed,
        }

    return Shop(app=app, process_order=process_order, pack_all=pack_all, audit=audit)


def submit_and_wait(shop: Shop, order: Order) -> dict[str, Any]:
    """The blocking forms: the id is a `TaskId` typed by the workflow, and a `str`."""
    task_id = shop.app.submit(shop.process_order, order)
    assert_type(task_id, sw.TaskId[dict[str, Any]])
    plain: str = task_id
    assert plain == task_id
    return assert_type(shop.app.result(task_id, timeout=60), dict[str, Any])


async def typed_calls(app: sw.App, order: Order) -> None:
    """The calls a user makes, each result of the declared type (never run: checked)."""

    @app.workflow(name="count")
    async def count(ctx: sw.Context, items: list[str]) -> int:
        return len(items)

    @app.workflow(name="nothing")
    async def nothing(ctx: sw.Context, unused: None) -> str:
        return "done"

    counted = await app.submit_async(count, order["items"], task_id="c-1", priority=2)
    assert_type(counted, sw.TaskId[int])
    total: int = await app.result_async(counted, timeout=5)
    assert_type(await app.result_async(counted), int)
    ended = await app.submit_async(nothing)  # no input: the workflow takes None
    text: str = await app.result_async(ended)
    anything = await app.submit_async("count", ["a"])  # by name: the result is Any
    assert_type(anything, sw.TaskId[Any])
    unknown: list[int] = await app.result_async(anything)
    assert_type(await app.result_async(sw.TaskId("c-1")), Any)
    assert_type(await app.result_async(sw.TaskId[int]("c-1")), int)
    async with app.transaction() as tx:
        in_tx = await tx.submit(count, ["a", "b"], task_id="c-2")
    assert_type(in_tx, sw.TaskId[int])
    two: int = await app.result_async(in_tx)
    by_string: Any = await app.result_async("c-2")  # a plain str: Any
    status: sw.TaskRecord = await app.status_async(counted)
    assert (total, text, unknown, two, by_string, status) is not None
