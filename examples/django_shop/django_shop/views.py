import json
from typing import Any

from django.db import IntegrityError, transaction
from django.http import HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_GET, require_POST

import stepwarden

from . import tasks
from .models import Order


@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    """Save the order and its lines; its task is submitted once they commit, and not at all
    if they roll back (a line the database refuses: a quantity of 0)."""
    try:
        body = json.loads(request.body)
        customer, lines = body["customer"], body["lines"]
        with transaction.atomic():
            order = Order.objects.create(customer=customer)
            work = {"order_id": order.pk, "customer": customer, "lines": lines}
            transaction.on_commit(
                lambda: tasks.app.submit(tasks.process_order, work, task_id=order.task_id)
            )
            for line in lines:
                order.lines.create(sku=line["sku"], quantity=line["quantity"])
    except (ValueError, KeyError, TypeError, IntegrityError) as exc:
        return JsonResponse({"error": f"invalid order: {exc}"}, status=400)
    return JsonResponse({"order_id": order.pk, "task_id": order.task_id}, status=201)


@require_GET
def order_status(request: HttpRequest, order_id: int) -> JsonResponse:
    order = get_object_or_404(Order, pk=order_id)
    answer: dict[str, Any] = {"order_id": order.pk}
    try:
        task = tasks.app.status(order.task_id)
    except stepwarden.TaskNotFound:  # saved, but its process died before the submit
        return JsonResponse({**answer, "state": None})
    return JsonResponse(
        {**answer, "state": task.process_state, "result": task.result, "error": task.error}
    )
