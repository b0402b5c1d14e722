"""Misuses that mypy (strict) must report: each line marked `# E: <code>` is one error of that
code, and no other line has one. Kept out of the project's own mypy run (pyproject's
`exclude`); `tests/typed/test_mypy.py` checks it."""

from __future__ import annotations

from datetime import timedelta

import stepwarden as sw
from tests.typed.typed_shop import Order, Receipt

app = sw.App("misuse", store="sqlite:///misuse.db")
payments = app.agent("payments")


@payments.operation
async def charge(call: sw.Call, order: Order) -> Receipt:
    return {"order": order["id"], "key": call.idempotency_key}


@payments.operation
def refund(call: sw.Call, receipt: Receipt) -> None:
    return None


@payments.operation
async def fee(call: sw.Call, amount: int, currency: str) -> float:
    return amount * 0.01


@app.workflow
async def pay(ctx: sw.Context, order: Order) -> Receipt:
    await ctx.step(charge, "order-42")  # E: misc
    await ctx.step(fee, 5)  # E: misc
    await ctx.step(fee, "5", "EUR")  # E: misc
    await ctx.step(fee, 5, "EUR", "extra")  # E: misc
    await ctx.step(charge, order, compensate=refund)  # E: misc
    await ctx.step(charge, order, complete_within="30 s")  # E: arg-type
    await ctx.sleep(timedelta(seconds=1))
    await ctx.sleep(1.5)
    await ctx.step(charge, order, retries=3)  # E: call-arg
    text: str = await ctx.step(fee, 5, "EUR")  # E: arg-type
    receipt = await ctx.step(charge, order)
    receipt["amount"]  # E: typeddict-item
    parts: list[str] = await ctx.gather(*(ctx.step(fee, n, "EUR") for n in (1, 2)))  # E: arg-type
    child: int = await ctx.child(pay, order)  # E: arg-type
    await ctx.child(pay, "order-42")  # E: arg-type
    assert text and parts and child
    return receipt


@app.workflow
async def tally(ctx: sw.Context, amounts: list[int]) -> int:
    return sum(amounts)


def submit_and_read() -> None:
    app.submit(tally, "12")  # E: arg-type
    app.submit(tally)  # E: arg-type
    app.submit(tally, [1, 2], priority="high")  # E: call-overload
    task_id = app.submit(tally, [1, 2])
    total: str = app.result(task_id)  # E: assignment
    app.result(task_id).upper()  # E: attr-defined
    other: sw.TaskId[str] = task_id  # E: assignment
    timed_out = app.result(task_id, timeout="1 s")  # E: call-overload
    app.result(task_id, timeout=timedelta(seconds=1))
    app.submit(tally, [1, 2], start_after=timedelta(minutes=1))
    app.submit(tally, [1, 2], start_after=60)
    assert other and timed_out and total


async def in_a_transaction() -> None:
    async with app.transaction() as tx:
        await tx.submit(tally, {"amounts": [1]})  # E: arg-type
