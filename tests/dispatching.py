"""A scheduler's step writes as tests build them: one helper for the three kinds."""

from __future__ import annotations

from typing import Any, Literal

from stepwarden.records import Adopt, NewStep, Redispatch, StepDispatch

Kind = Literal["new", "redispatch", "adopt"]


def step_dispatch(
    kind: str,
    *,
    task_id: str,
    task_attempt: int,
    scheduler: str,
    seq: int,
    name: str,
    agent: str,
    operation: str,
    input: str,
    priority: int,
    complete_within: float,
    expected_attempt: int = 0,
    **new_only: Any,
) -> StepDispatch:
    """A NewStep, a Redispatch or an Adopt of one step; the fields a kind does not have are
    ignored (`new_only`: compensation, limit key, timeouts of a new step)."""
    if kind == "new":
        return NewStep(
            task_id=task_id,
            task_attempt=task_attempt,
            scheduler=scheduler,
            seq=seq,
            name=name,
            agent=agent,
            operation=operation,
            input=input,
            priority=priority,
            complete_within=complete_within,
            **new_only,
        )
    if kind == "redispatch":
        return Redispatch(
            task_id=task_id,
            task_attempt=task_attempt,
            scheduler=scheduler,
            seq=seq,
            agent=agent,
            expected_attempt=expected_attempt,
            complete_within=complete_within,
        )
    if kind == "adopt":
        return Adopt(
            task_id=task_id,
            task_attempt=task_attempt,
            scheduler=scheduler,
            seq=seq,
            expected_attempt=expected_attempt,
        )
    raise ValueError(f"no dispatch of kind {kind!r}")


def new_step(step: StepDispatch) -> NewStep:
    """A dispatch built as a new step, as one: for the fields only a new step has."""
    assert isinstance(step, NewStep), step
    return step
