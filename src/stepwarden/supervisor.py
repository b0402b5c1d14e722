"""The supervisor: periodically finds work whose complete_by passed and requests recovery.

It knows nothing of the business operations: it reads the state kept by the schedulers,
increments failure_count, and releases each expired task (a scheduler picks it up again after
a backoff) or, at the task's max_failures, gives it up by its on_failure policy with an alert.
Before that, it gives back the tasks of scheduler instances that stopped heartbeating and
hands the running steps of agent instances that stopped heartbeating to others (neither is a
failure: no work was judged), and fails steps past their pick-up or total timeout.
Several supervisors may run; one is active at a time, by a lease with a term number in the
store, and every write of a sweep is fenced by that term. The leader also deletes finished
tasks past their retention and, beside its sweep (a task of its own, so that a slow sink
never holds recovery up, stopped with the supervisor), delivers the outbox's alerts to the
App's sinks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

from . import tracing
from ._aio import sleep_unless, stop_tasks, until_beat
from .alerts import AlertDeliverer
from .errors import TransientStoreError
from .metrics import Metrics
from .records import (
    Expired,
    OpLimit,
    Released,
    ScheduleSpec,
    StepSwept,
    TicksMade,
    WaitReason,
    Woke,
)
from .relay import Relay
from .retry import Backoff
from .rules import AlertReason, holding_gate, step_gate, task_gate
from .states import FINISHED_TASK_STATES
from .store.ports import SupervisorPort

logger = logging.getLogger("stepwarden.supervisor")
T = TypeVar("T")

LEASE = "supervisor"
DEFAULT_RETENTION = 7 * 24 * 3600.0
"""Seconds a finished task is kept (processed, compensated, cancelled)."""
FORGET_AFTER = 3600.0
"""Seconds a gone agent or scheduler instance stays in the registry."""
STUCK_EVERY = 10.0
"""The most seconds between the leader's looks for stuck tasks (`Supervisor._alert_stuck`)."""
DUE_AFTER = 0.01
"""Seconds past an expiry at which the tick it is due for comes."""


class Supervisor:
    def __init__(
        self,
        store: SupervisorPort,
        *,
        instance: str,
        interval: float = 1.0,
        lease_ttl: float | None = None,
        batch: int = 500,
        backoff: Backoff | None = None,
        alerts: AlertDeliverer | None = None,
        relay: Relay | None = None,
        retention: float | None = DEFAULT_RETENTION,
        purge_batch: int = 200,
        gone_grace: float = 5.0,
        schedules: Sequence[ScheduleSpec] = (),
        metrics: Metrics | None = None,
        beat_every: float | None = None,
        stuck: Mapping[str, float] | None = None,
        limits: Mapping[tuple[str, str], OpLimit] | None = None,
    ) -> None:
        self.store = store
        self.stuck = dict(stuck or {})
        """Each workflow's stuck_after (`App.workflow`): the leader raises one task_stuck
        alert per task and reason that holds it, for a task unmoved that long."""
        self.limits = dict(limits or {})
        """The App's operation limits, for what holds a stuck task (`App.operation_limits`)."""
        self._stuck_at = 0.0
        """When (monotonic) the leader last looked for stuck tasks."""
        self.metrics = metrics or Metrics()
        """Where it counts what its sweeps recover (its worker's)."""
        self.metrics.watch_supervisor(self)
        self.schedules = list(schedules)
        """The application's schedules: stored when this supervisor becomes the leader."""
        self.gone_grace = gone_grace
        """Seconds the store must have answered this supervisor without a break before it
        finds anyone gone (`_grace_ends`): during a break the heartbeats of the others may
        not have landed either."""
        self._reached_at: float | None = None
        """When (monotonic) the store began to answer this supervisor's ticks, as leader or
        standby: its first answered tick after a failed one."""
        self.instance = instance
        self.interval = interval
        self.lease_ttl = lease_ttl if lease_ttl is not None else max(5.0, 3 * interval)
        self.batch = batch
        self.backoff = backoff or Backoff()
        self.alerts = alerts
        self.relay = relay
        """Status messages for brokers, delivered by the leader beside its sweep (one relay
        at a time keeps each task's messages in order)."""
        self.retention = retention
        self.purge_batch = purge_batch
        self.term: int | None = None
        self.beat_every = beat_every
        """Seconds between the registry beats of this process's scheduler or agents (None
        when it has neither): a standby looks at the lease at each beat, in the beat's
        transaction (`Store.look_lease`), and tries it only when the lease is due to lapse
        before the next beat."""
        self._try_at: float | None = None
        """When (monotonic) the lease another holds lapses, as read by the last try or look:
        the standby's next try is due then."""
        self._look_next = False
        """Whether the standby's next call is a look at the lease (at a beat) rather than a
        try of it."""
        self._soon: float | None = None
        """Seconds until the next registry row's expiry, as read by the leader's last round."""

    async def run(self, stop: asyncio.Event) -> None:
        delivering = None
        if self.alerts is not None:
            # Beside the sweep, never in it: a slow alert sink cannot hold recovery up.
            delivering = asyncio.create_task(
                self.alerts.run(stop, lambda: self.term is not None, self.interval)
            )
        relaying = None
        if self.relay is not None:
            relaying = asyncio.create_task(
                self.relay.run(stop, lambda: self.term is not None, min(self.interval, 0.2))
            )
        try:
            while not stop.is_set():
                pause = self.interval
                try:
                    if self._look_next:
                        await self._look()
                    else:
                        await self.tick()
                    pause = await self._pause()
                except TransientStoreError as exc:  # the store is out of reach: next interval
                    logger.warning("supervisor: %s", exc)
                    self._reached_at = None
                    self._look_next = False
                except Exception:  # a bug, or the store refusing a query: said in full
                    logger.exception("supervisor: the tick failed")
                    self._look_next = False
                await sleep_unless(stop, pause)
        finally:
            try:  # a delivery under way is abandoned: sent again later
                await stop_tasks(delivering, relaying)
            finally:
                if self.term is not None:
                    try:
                        await self.store.release_lease(LEASE, self.instance)
                    except Exception as exc:
                        logger.warning("supervisor: cannot release the lease: %s", exc)

    async def tick(self) -> list[Expired]:
        """Take or renew the lease, and sweep if it is held. Returns what was recovered."""
        # A frozen leader may hold the lease row locked in the middle of its sweep: its
        # session is ended first (after a while), in the same transaction, or the lease
        # could not change hands.
        tried = await self.store.try_lease(LEASE, self.instance, self.lease_ttl)
        term = tried.term
        now = time.monotonic()
        self._try_at = None if tried.lapses_in is None else now + tried.lapses_in
        self._soon = None
        if self._reached_at is None:
            self._reached_at = now  # a standby counts too: a new leader does not wait again
        if term != self.term:
            if term is None:
                logger.info("supervisor %s: lease lost (term %s)", self.instance, self.term)
            else:
                logger.info("supervisor %s: leader at term %d", self.instance, term)
        became_leader = term is not None and term != self.term
        self.term = term
        if term is None:
            return []
        if became_leader and self.schedules:
            refused = await self.store.store_schedules(self.schedules)
            for name, why in refused.items():
                logger.error("schedule %s: not stored: %s", name, why)
        began = time.time_ns()
        others_heard = self._others_heard(now)
        # One transaction for the first batch of every sweep (at rest, all there is); a
        # sweep whose batch came back full goes on in batches of its own.
        found = await self.store.sweep_round(
            lease=LEASE,
            holder=self.instance,
            term=term,
            limit=self.batch,
            backoff=self.backoff,
            forget_after=FORGET_AFTER,
            release=others_heard,
            purge_after=self.retention,
            purge_limit=self.purge_batch,
        )
        self._soon = found.next_expiry
        released = await self._release(term, found.released) if others_heard else []
        woke = await self._wake(term, found.woke)
        created = await self._ticks(term, found.ticks)
        swept = await self._sweep_steps(term, reassign=others_heard, first=found.swept)
        recovered = await self._sweep(term, found.expired)
        if (released or woke or created or swept or recovered) and tracing.active():
            self._traced(began, term, released, woke, created, swept, recovered)
        if found.purged:
            # A small batch each tick keeps the hot tables small without long transactions.
            logger.info("supervisor: purged %d finished task(s) past retention", found.purged)
        if self.stuck and time.monotonic() >= self._stuck_at + self._stuck_every():
            self._stuck_at = time.monotonic()
            await self._alert_stuck()
        return recovered

    def _stuck_every(self) -> float:
        """How often the leader looks for stuck tasks: at half the shortest threshold, at
        most every STUCK_EVERY seconds, at least every tick."""
        return max(self.interval, min(STUCK_EVERY, min(self.stuck.values()) / 2))

    async def _alert_stuck(self) -> None:
        """One task_stuck alert for each task that has not moved for its workflow's
        stuck_after, once per task and reason that holds it (`rules.holding_gate`)."""
        for workflow, after in sorted(self.stuck.items()):
            for task_id in await self.store.stale_tasks(workflow, after, self.batch):
                found = await self.store.why_facts(task_id, self.limits)
                if found is None:
                    continue
                facts, steps = found
                gate = holding_gate(task_gate(facts), [step_gate(f) for f in steps])
                if gate.reason in (WaitReason.FINISHED, WaitReason.SET_ASIDE):
                    continue
                if await self.store.stuck_alerted(task_id, str(gate.reason)):
                    continue
                error = f"task {task_id!r} has not moved for {after:g}s: {gate.reason}"
                detail = {
                    "reason": str(AlertReason.TASK_STUCK),
                    "wait_reason": str(gate.reason),
                    "stuck_after": after,
                    "error": error,
                }
                logger.warning("ALERT task %s: %s", task_id, error)
                self.metrics.alert(str(AlertReason.TASK_STUCK))
                await self.store.record_events([(task_id, "alert", detail)])

    async def _look(self) -> None:
        """The standby's look at the lease, beside its process's registry beats: when the
        lease another holds lapses (its leader renewing it, later at each look)."""
        lapses_in = await self.store.look_lease(LEASE, self.instance)
        now = time.monotonic()
        if self._reached_at is None:
            self._reached_at = now
        self._try_at = now if lapses_in is None else now + lapses_in

    def leads(self) -> bool:
        """Whether it holds the lease now (a gauge of its metrics)."""
        return self.term is not None

    def _traced(
        self,
        began: int,
        term: int,
        released: list[Released],
        woke: list[Woke],
        created: list[str],
        swept: list[StepSwept],
        expired: list[Expired],
    ) -> None:
        """The span of a sweep that found work (`tracing`; made once it is known that it did,
        from its start: an idle tick makes none), with a span for each task it acted on."""
        sweep = tracing.start(
            "supervisor sweep",
            attrs=tracing.attributes(
                supervisor=self.instance,
                term=term,
                released=len(released),
                woke=len(woke),
                created=len(created),
                steps_swept=len(swept),
                expired=len(expired),
            ),
            start_time=began,
        )
        ended = time.time_ns()
        items: list[tuple[str, dict[str, object]]] = []
        for r in released:
            attrs: dict[str, object] = {"scheduler": r.scheduler, "outcome": str(r.process_state)}
            items.append((f"release {r.task_id}", {"task_id": r.task_id, **attrs}))
        for w in woke:
            items.append((f"wake {w.task_id}", {"task_id": w.task_id, "waited_for": w.waited_for}))
        for t in created:
            items.append((f"tick {t}", {"task_id": t}))
        for s in swept:
            attrs = {"seq": s.seq, "outcome": s.kind, "agent": s.agent}
            attrs["agent_instance"] = s.instance
            items.append((f"{s.kind} step {s.seq} of {s.task_id}", {"task_id": s.task_id, **attrs}))
        for e in expired:
            attrs = {"seq": e.seq, "failure_count": e.failure_count, "set_aside": e.set_aside}
            attrs["outcome"] = str(e.process_state)
            items.append((f"expire {e.task_id}", {"task_id": e.task_id, **attrs}))
        for name, attrs in items:
            tracing.start(
                name, parent_of=sweep, attrs=tracing.attributes(**attrs), start_time=began
            ).end(ended)
        sweep.end(ended)

    def _grace_ends(self) -> float | None:
        """When (monotonic) a scheduler or agent instance whose registry row has expired (by
        the database clock) may be found gone, not merely unheard: once the store has
        answered this supervisor's process without a break for `gone_grace` seconds, counted
        from the later of this supervisor's first answered tick after a failed one (leader or
        standby: a standby that takes the lease has been counting all along) and the last
        time the process lost the server (`Store.lost_at`: a connection lost, a probe
        refused). After such a break every heartbeat is late, the alive instances' too: they
        are given the grace to beat again. None while its ticks fail."""
        if self._reached_at is None:
            return None
        return max(self._reached_at, self.store.lost_at) + self.gone_grace

    def _others_heard(self, now: float) -> bool:
        ends = self._grace_ends()
        return ends is not None and now >= ends

    async def _pause(self) -> float:
        """Seconds until the next tick: the interval, or less when something is due sooner,
        so that it is acted on when due rather than up to an interval later: a registry row's
        expiry (an instance silent since is gone then), the end of this leader's grace. A
        standby ticks when the lease another holds lapses (read by its last try or look of
        the lease): it has nothing else to do, and tries no more often than that. While
        the lease is due to lapse after its process's next registry beat, it looks at the
        lease again at that beat, in the beat's transaction, rather than try it: a leader
        that renews its lease moves the lapse on at each look, and the standby tries it
        only when it lapses, as soon as it would have without the looks."""
        self._look_next = False
        if self.term is None:
            if self._try_at is None:
                return self.interval
            due_in = self._try_at - time.monotonic() + DUE_AFTER
            if self.beat_every is not None:
                beat_in = until_beat(self.beat_every)
                if beat_in < due_in:
                    self._look_next = True
                    return beat_in
            return max(due_in, DUE_AFTER)
        pause = self.interval
        soon = self._soon
        if soon is not None:
            pause = min(pause, soon + DUE_AFTER)
        ends = self._grace_ends()
        left = None if ends is None else ends - time.monotonic()
        if left is not None and left > 0:
            pause = min(pause, left + DUE_AFTER)
        return pause

    async def _ticks(self, term: int, made: TicksMade) -> list[str]:
        """The tasks of the schedules' due ticks (one per tick, whoever races for it), from
        the round's first batch (`made`) on."""
        if len(made.created) + len(made.set_aside) >= self.batch:
            more = await self.store.create_ticks(
                lease=LEASE, holder=self.instance, term=term, limit=self.batch
            )
            made = TicksMade([*made.created, *more.created], {**made.set_aside, **more.set_aside})
        for task_id in made.created:
            logger.info("schedule: task %s created", task_id, extra={"task_id": task_id})
        for name, why in made.set_aside.items():
            logger.error("schedule %s: paused, its ticks cannot be worked out: %s", name, why)
        return made.created

    async def _in_batches(
        self,
        sweep: Callable[[], Awaitable[list[T]]],
        say: Callable[[T], None],
        first: list[T] | None = None,
    ) -> list[T]:
        """What `sweep` (one batch of `batch` at most, in a transaction under the lease) finds,
        batch after batch (the first one `first`, when the round found it), each item said
        as it comes, until a batch comes back short: all done, or the lease lost (a sweep
        under a lease no longer held writes nothing and finds nothing)."""
        found: list[T] = []
        while True:
            batch, first = (await sweep() if first is None else first), None
            for item in batch:
                say(item)
            found.extend(batch)
            if len(batch) < self.batch:
                return found

    async def _wake(self, term: int, first: list[Woke]) -> list[Woke]:
        """Waiting tasks whose time has come (a timer, a wait's timeout, a delayed start),
        made pending for a scheduler to resume."""

        def say(w: Woke) -> None:  # the ordinary end of a wait: its history records it
            logger.debug(
                "task %s: woke (it waited for %s)",
                w.task_id,
                w.waited_for,
                extra={"task_id": w.task_id},
            )

        return await self._in_batches(
            lambda: self.store.wake_due(
                lease=LEASE, holder=self.instance, term=term, limit=self.batch
            ),
            say,
            first,
        )

    async def _release(self, term: int, first: list[Released]) -> list[Released]:
        """The tasks of scheduler instances gone silent, given back for another to resume."""

        def say(r: Released) -> None:
            logger.warning(
                "task %s: released, its scheduler instance %s is gone (now %s)",
                r.task_id,
                r.scheduler,
                r.process_state,
                extra={"task_id": r.task_id},
            )

        return await self._in_batches(
            lambda: self.store.release_gone_schedulers(
                lease=LEASE,
                holder=self.instance,
                term=term,
                limit=self.batch,
                forget_after=FORGET_AFTER,
            ),
            say,
            first,
        )

    async def _sweep_steps(
        self, term: int, *, reassign: bool, first: list[StepSwept]
    ) -> list[StepSwept]:
        """Steps of gone agent instances to others; steps past their pick-up or total
        timeout failed."""

        def say(s: StepSwept) -> None:
            self.metrics.step_swept(s.kind)
            if s.kind == "reassigned":
                logger.warning(
                    "task %s: step %d reassigned: agent instance %s is gone",
                    s.task_id,
                    s.seq,
                    s.instance,
                    extra={"task_id": s.task_id, "seq": s.seq},
                )
            else:
                logger.warning(
                    "task %s: step %d failed: %s timeout",
                    s.task_id,
                    s.seq,
                    s.kind,
                    extra={"task_id": s.task_id, "seq": s.seq},
                )

        return await self._in_batches(
            lambda: self.store.sweep_steps(
                lease=LEASE,
                holder=self.instance,
                term=term,
                limit=self.batch,
                forget_after=FORGET_AFTER,
                reassign=reassign,
            ),
            say,
            first,
        )

    async def _sweep(self, term: int, first: list[Expired]) -> list[Expired]:
        def say(e: Expired) -> None:
            self.metrics.expired(e.seq, e.process_state, e.alert)
            if e.set_aside:
                return  # said by the store, with its reason
            where = f"step {e.seq}" if e.seq is not None else "task"
            log = logger.error if e.process_state in FINISHED_TASK_STATES else logger.warning
            log(
                "task %s: %s expired (failure_count %d): now %s",
                e.task_id,
                where,
                e.failure_count,
                e.process_state,
                extra={"task_id": e.task_id, "seq": e.seq},
            )

        return await self._in_batches(
            lambda: self.store.sweep(
                lease=LEASE,
                holder=self.instance,
                term=term,
                limit=self.batch,
                backoff=self.backoff,
            ),
            say,
            first,
        )
