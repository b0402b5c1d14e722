"""The scheduler registry and the release of held tasks, on each store: a gone scheduler's
tasks are given back at once (not at their complete_by), without counting a failure, fenced
by the attempt and the hold; a draining scheduler gives back its own."""

from __future__ import annotations

import asyncio
import time

from stepwarden.records import SchedulerBeat, TaskOutcome
from stepwarden.states import TaskState
from stepwarden.store import Store
from stepwarden.supervisor import Supervisor

from ..support.store import beat as agent_beat
from ..support.store import dispatch, new_task, outcome, undoable

LEASE = "supervisor"


def beat(instance: str, *, held: int = 0) -> SchedulerBeat:
    return SchedulerBeat(instance=instance, workflows=("wf",), capacity=100, held=held)


async def release(
    store: Store, *, holder: str = "sup", forget_after: float = 3600
) -> dict[str, TaskState]:
    term = await store.acquire_lease(LEASE, holder, 30)
    assert term is not None
    released = await store.release_gone_schedulers(
        lease=LEASE, holder=holder, term=term, limit=100, forget_after=forget_after
    )
    return {r.task_id: r.process_state for r in released}


async def claim(store: Store, scheduler: str, task_id: str) -> int:
    [claimed] = await store.claim_tasks(scheduler, ["wf"], 1)
    assert claimed.task.task_id == task_id
    return claimed.task.attempt


async def test_the_registry_shows_each_scheduler_alive_until_it_leaves(store: Store) -> None:
    await store.beat_schedulers([beat("s1"), beat("s2", held=3)], ttl=30)
    found = {s.instance: s for s in await store.list_schedulers()}
    assert set(found) == {"s1", "s2"} and all(s.alive for s in found.values())
    assert (found["s2"].held, found["s2"].capacity, found["s2"].workflows) == (3, 100, ("wf",))
    await store.leave_scheduler("s1")
    alive = {s.instance: s.alive for s in await store.list_schedulers()}
    assert alive == {"s1": False, "s2": True}
    assert await release(store, forget_after=0) == {}
    assert [s.instance for s in await store.list_schedulers()] == ["s2"]  # s1 forgotten


async def test_a_gone_schedulers_tasks_are_given_back_at_once(store: Store) -> None:
    await store.beat_schedulers([beat("s1"), beat("s2")], ttl=30)
    # s1 holds a processing task with a step queued, and a compensating one; s2 holds one;
    # "s9" holds one and never registered (an older scheduler): only its deadline frees it.
    await store.submit([new_task("work", within=60)])
    work = await claim(store, "s1", "work")
    assert await store.dispatch_steps([dispatch("work", work, within=60)]) != [None]
    await store.submit([new_task("undo", within=60)])
    undo = await claim(store, "s1", "undo")
    assert await store.dispatch_steps([undoable(dispatch("undo", undo, within=60))]) != [None]
    claimed = await store.claim_requests("a1", "pay", ["charge"], 2)
    assert sorted(r.task_id for r in claimed) == ["undo", "work"]
    assert await store.complete_steps([outcome("undo", 1)]) == [True]
    declined = TaskOutcome(task_id="undo", attempt=undo, scheduler="s1",
                           state=TaskState.ERROR, result=None, error="declined")  # fmt: skip
    assert await store.finish_tasks([declined]) == [True]
    await claim(store, "s1", "undo")  # its compensation, held by s1
    await store.submit([new_task("other", within=60)])
    await claim(store, "s2", "other")
    await store.submit([new_task("unknown", within=60)])
    await claim(store, "s9", "unknown")

    assert await release(store) == {}  # nobody is gone yet
    await store.leave_scheduler("s1")
    assert await release(store) == {"work": TaskState.PENDING, "undo": TaskState.COMPENSATING}
    for task_id in ("work", "undo"):
        task = await store.get_task(task_id)
        assert task is not None and task.locked_by is None and task.complete_by is None
        assert (task.failure_count, task.compensation_failures) == (0, 0)
        [event] = await store.events(task_id=task_id, kind="released")
        assert event.detail["from"] == "s1" and event.detail["by"] == "sup"
        assert event.detail["reason"] == "scheduler gone" and event.detail["term"] >= 1
    for task_id, holder in (("other", "s2"), ("unknown", "s9")):
        task = await store.get_task(task_id)
        assert task is not None and task.locked_by == holder
    # Another scheduler takes the work up at once and adopts its step, still in time.
    again = await claim(store, "s2", "work")
    adopt = dispatch("work", again, scheduler="s2", kind="adopt", expected=1)
    [got] = await store.dispatch_steps([adopt])
    assert got is not None and got.attempt == 1


async def test_a_draining_scheduler_gives_back_only_what_it_still_holds(store: Store) -> None:
    await store.beat_schedulers([beat("s1"), beat("s2")], ttl=30)
    for task_id in ("t1", "t2"):
        await store.submit([new_task(task_id, within=60)])
        await claim(store, "s1", task_id)
    # t2 changed hands meanwhile: s1 was found gone, s2 took it.
    await store.leave_scheduler("s1")
    assert await release(store) == {"t1": TaskState.PENDING, "t2": TaskState.PENDING}
    await store.beat_schedulers([beat("s1")], ttl=30)  # s1 was only slow: it beats again
    await claim(store, "s1", "t1")
    await claim(store, "s2", "t2")
    released = await store.release_held("s1")
    assert [(r.task_id, r.process_state) for r in released] == [("t1", TaskState.PENDING)]
    [_, drained] = await store.events(task_id="t1", kind="released")
    assert (drained.detail["from"], drained.detail["by"]) == ("s1", "s1")
    assert drained.detail["reason"] == "drained" and drained.detail["term"] is None
    t2 = await store.get_task("t2")
    assert t2 is not None and t2.locked_by == "s2"


async def test_nothing_is_given_back_without_the_lease(store: Store) -> None:
    await store.beat_schedulers([beat("s1")], ttl=30)
    await store.submit([new_task("t1", within=60)])
    await claim(store, "s1", "t1")
    await store.leave_scheduler("s1")
    term = await store.acquire_lease(LEASE, "sup", 30)
    assert term is not None
    stale = await store.release_gone_schedulers(
        lease=LEASE, holder="sup", term=term + 1, limit=100, forget_after=3600
    )
    assert stale == []
    t1 = await store.get_task("t1")
    assert t1 is not None and t1.locked_by == "s1"


async def test_a_standby_that_takes_the_lease_finds_the_silent_at_once(store: Store) -> None:
    # The grace (the store answering for a while before anyone is found gone) runs while a
    # supervisor stands by: taking the lease, it does not wait for it again.
    await store.beat_schedulers([beat("s1")], ttl=30)
    await store.submit([new_task("t1", within=60)])
    await claim(store, "s1", "t1")
    await store.leave_scheduler("s1")  # s1 is silent from now on
    assert await store.acquire_lease(LEASE, "leader", 1.0) is not None
    standby = Supervisor(store, instance="standby", interval=0.05, lease_ttl=30, gone_grace=0.5)
    assert await standby.tick() == [] and standby.term is None
    deadline = time.monotonic() + 30
    while standby.term is None:  # until the leader's lease lapses, a second from now
        assert time.monotonic() < deadline, "the standby never took the lease"
        await asyncio.sleep(0.05)
        await standby.tick()
    t1 = await store.get_task("t1")
    assert t1 is not None and t1.locked_by is None and t1.process_state == TaskState.PENDING


async def test_after_losing_the_store_a_supervisor_waits_its_grace(store: Store) -> None:
    await store.beat_schedulers([beat("s1")], ttl=30)
    await store.submit([new_task("t1", within=60)])
    await claim(store, "s1", "t1")
    await store.leave_scheduler("s1")
    supervisor = Supervisor(store, instance="sup", interval=0.05, lease_ttl=30, gone_grace=30)
    supervisor._reached_at = time.monotonic() - 60  # it has reached the store for a minute
    store._lost()  # but its process lost the server just now: the others may not have beaten
    await supervisor.tick()
    t1 = await store.get_task("t1")
    assert supervisor.term is not None and t1 is not None and t1.locked_by == "s1"


async def test_the_next_expiry_is_the_soonest_registry_row_or_the_lease_another_holds(
    store: Store,
) -> None:
    assert await store.next_expiry(LEASE, "sup") is None  # nothing to come
    await store.beat_schedulers([beat("s1")], ttl=30)
    await store.beat([agent_beat("a1")], ttl=20)
    soon = await store.next_expiry(LEASE, "sup")
    assert soon is not None and 15 < soon <= 20
    assert await store.acquire_lease(LEASE, "other", 10) is not None
    soon = await store.next_expiry(LEASE, "sup")
    assert soon is not None and 5 < soon <= 10
    held = await store.next_expiry(LEASE, "other")  # its own lease is not waited for
    assert held is not None and 15 < held <= 20
    await store.leave_scheduler("s1")  # expired: no longer to come
    await store.beat_schedulers([beat("s2")], ttl=3)
    soon = await store.next_expiry(LEASE, "other")
    assert soon is not None and 0 < soon <= 3


async def test_a_supervisor_ticks_when_a_registry_row_expires_not_an_interval_later(
    store: Store,
) -> None:
    """A leader whose interval is 30 s: a scheduler silent since its last beat (1 s to live)
    is found gone when its row expires, and its task given back, long before the interval's
    next tick."""
    await store.beat_schedulers([beat("s1")], ttl=1.0)
    await store.submit([new_task("t1", within=120)])
    await claim(store, "s1", "t1")  # and s1 beats no more
    supervisor = Supervisor(store, instance="sup", interval=30, lease_ttl=60, gone_grace=0.2)
    stop = asyncio.Event()
    running = asyncio.create_task(supervisor.run(stop))
    try:
        deadline = time.monotonic() + 15  # half the interval
        while True:
            t1 = await store.get_task("t1")
            assert t1 is not None
            if t1.locked_by is None:
                break
            assert time.monotonic() < deadline, "s1's task was not given back before 15 s"
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await running
    assert t1.process_state == TaskState.PENDING and t1.failure_count == 0


async def test_a_standbys_look_at_the_lease_says_when_it_lapses_and_takes_nothing(
    store: Store,
) -> None:
    assert await store.look_lease(LEASE, "standby") is None  # never taken: take it now
    term = await store.acquire_lease(LEASE, "leader", 10)
    assert term is not None
    lapses = await store.look_lease(LEASE, "standby")
    assert lapses is not None and 5 < lapses <= 10
    assert await store.look_lease(LEASE, "leader") is None  # its own: renew it now
    lease = await store.read_lease(LEASE)
    assert lease is not None and (lease.holder, lease.term) == ("leader", term)


async def test_a_standby_looking_beside_the_beats_takes_a_lease_that_lapses(store: Store) -> None:
    # While the leader renews, the standby's looks find the lease live; once it stops, the
    # standby takes the lease when it lapses.
    assert await store.acquire_lease(LEASE, "leader", 1.0) is not None
    standby = Supervisor(
        store, instance="standby", interval=0.05, lease_ttl=30, gone_grace=0.5, beat_every=0.1
    )
    stop = asyncio.Event()
    running = asyncio.create_task(standby.run(stop))
    try:
        renew_until = time.monotonic() + 1.5
        while time.monotonic() < renew_until:  # longer than the lease: it stays the leader's
            assert await store.acquire_lease(LEASE, "leader", 1.0) is not None
            assert standby.term is None
            await asyncio.sleep(0.2)
        deadline = time.monotonic() + 30
        while standby.term is None:  # the leader is silent: its lease lapses within 1 s
            assert time.monotonic() < deadline, "the standby never took the lease"
            await asyncio.sleep(0.05)
        lease = await store.read_lease(LEASE)
        assert lease is not None and lease.holder == "standby"
    finally:
        stop.set()
        await running
