"""A small shop service on FastAPI, its orders processed by stepwarden on PostgreSQL.

    POST /orders                  insert the order and submit its task, in one transaction
    GET  /orders/{id}             the order's state, and its result once processed
    GET  /orders/{id}/events      the order's status messages, as server-sent events
    /ops/api/...                  the stepwarden dashboard's API, behind the staff's auth

    SHOP_STORE=postgresql://postgres@127.0.0.1:5432/shop SHOP_STAFF="alice:TOKEN" \\
        uvicorn examples.fastapi_shop.service:service
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, Path
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.sse import EventSourceResponse, ServerSentEvent
from psycopg.errors import ForeignKeyViolation
from pydantic import BaseModel, Field

import stepwarden
from stepwarden import dashboard

from .shop import app, process_order

# The service's own tables, in the store's database (a real service has its own migrations).
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS customers (customer_id text PRIMARY KEY)",
    "INSERT INTO customers VALUES ('ann'), ('bob') ON CONFLICT DO NOTHING",
    """CREATE TABLE IF NOT EXISTS orders (
        order_id text PRIMARY KEY,
        customer_id text NOT NULL REFERENCES customers,
        items jsonb NOT NULL,
        total_cents bigint NOT NULL,
        task_id text NOT NULL UNIQUE)""",
)


@contextlib.asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    async with app:  # at shutdown, closes what the App opened: its connections, its listener
        async with app.transaction() as tx:  # opens the store now: unreachable, no start
            for statement in SCHEMA:
                await tx.execute(statement)
        yield


service = FastAPI(title="shop", lifespan=lifespan)


# -- the service's own auth: staff members' bearer tokens --------------------------------
STAFF = {
    token: name
    for name, token in (entry.split(":", 1) for entry in os.environ.get("SHOP_STAFF", "").split())
}
"""Staff members' names by their token: SHOP_STAFF="alice:TOKEN bob:TOKEN"."""


def staff(
    credentials: Annotated[HTTPAuthorizationCredentials, Depends(HTTPBearer())],
) -> str:
    """The staff member whose bearer token the request carries (401 for any other)."""
    given = credentials.credentials.encode()
    for token, name in STAFF.items():
        if hmac.compare_digest(given, token.encode()):
            return f"staff:{name}"
    raise HTTPException(401, "not a staff token", headers={"WWW-Authenticate": "Bearer"})


# The dashboard's API (tasks, steps, history, alerts, operator actions, /metrics) under the
# staff's auth instead of its own token; each action's history records who acted.
service.mount("/ops", dashboard.create_app(app, auth=staff))


# -- orders ---------------------------------------------------------------------------------
class Item(BaseModel):
    sku: str = Field(min_length=1, max_length=64)
    quantity: int = Field(gt=0)
    price_cents: int = Field(ge=0)


class NewOrder(BaseModel):
    customer_id: str
    items: list[Item] = Field(min_length=1)


OrderId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$")]


@service.post("/orders", status_code=201)
async def place_order(new: NewOrder) -> dict[str, str]:
    """Submit the order's task and insert the order, in one transaction: both are recorded,
    or neither (an unknown customer: the insert fails, and the task goes with it)."""
    order_id = uuid.uuid4().hex
    items = [item.model_dump() for item in new.items]
    order = {
        "order_id": order_id,
        "customer_id": new.customer_id,
        "items": items,
        "total": sum(i.quantity * i.price_cents for i in new.items),
    }
    try:
        async with app.transaction() as tx:
            task_id = await tx.submit(
                process_order, order, task_id=f"order-{order_id}", reply_to="orders"
            )
            await tx.execute(
                "INSERT INTO orders (order_id, customer_id, items, total_cents, task_id)"
                " VALUES (%s, %s, %s::jsonb, %s, %s)",
                (order_id, new.customer_id, json.dumps(items), order["total"], task_id),
            )
    except stepwarden.PermanentStoreError as exc:
        if isinstance(exc.__cause__, ForeignKeyViolation):
            raise HTTPException(422, f"no customer {new.customer_id!r}") from None
        raise
    return {"order_id": order_id}


async def order_task(order_id: OrderId) -> stepwarden.TaskRecord:
    try:
        return await app.status_async(f"order-{order_id}")
    except stepwarden.TaskNotFound:
        raise HTTPException(404, f"no order {order_id!r}") from None


OrderTask = Annotated[stepwarden.TaskRecord, Depends(order_task)]


@service.get("/orders/{order_id}")
async def order_status(order_id: OrderId, task: OrderTask) -> dict[str, Any]:
    return {
        "order_id": order_id,
        "state": task.process_state,
        "result": task.result,
        "error": task.error,
    }


@service.get("/orders/{order_id}/events", response_class=EventSourceResponse)
async def order_events(
    task: OrderTask, last_event_id: Annotated[int, Header(ge=0)] = 0
) -> AsyncIterator[ServerSentEvent]:
    """The order's status messages (received, step_completed, ..., processed) as they are
    published, ending with the task's end; a client that reconnects with Last-Event-ID
    gets those after it."""
    async for message in app.watch(task.task_id):
        if message.id > last_event_id:
            yield ServerSentEvent(event=message.kind, id=str(message.id), data=message.detail)
