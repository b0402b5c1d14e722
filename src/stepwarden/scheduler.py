"""The scheduler: claims pending tasks and runs a drive for each (`drive.TaskDrive`).

One Scheduler instance runs many workflows concurrently as coroutines in one event loop: the
tasks of the (workflow, version)s it has, each with the version it was submitted with. It
keeps its loops (registry and heartbeats, claims within the agents' room, the warning of
versions it lacks, the watch of step results, which it hands to the drive of their task), the
group commit that writes the step records and task outcomes of its drives together, and one
map of task id to drive: everything of one task lives in its drive. Step results arrive by
wake-up (in-process, or LISTEN/NOTIFY on PostgreSQL) with polling as the fallback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Container, Mapping, Sequence
from functools import partial
from typing import Any

from ._aio import Pace, cancel_until_ended, first, sleep_unless, spread, until_beat
from ._batch import Batcher
from .agent import AnyOperation
from .drive import Entry, LocalAgent, TaskDrive
from .errors import StoreError, TransientStoreError
from .metrics import Metrics
from .records import Held, Released, SchedulerBeat, StepDispatch, TaskOutcome, step_of_key
from .retry import after_store_failure
from .rules import claim_fairly, unrunnable
from .store import CHANNEL_RESULTS, CHANNEL_TASKS, Subscription
from .store.ports import SchedulerPort
from .workflow import Workflow

logger = logging.getLogger("stepwarden.scheduler")

ROOM_EVERY = 0.05
"""Seconds between two reads of the agents' room (admission): a claim loop that woke often
would otherwise cost a read each time."""
DEFAULT_HEARTBEAT = 2.0
"""Seconds between a scheduler instance's heartbeats in the registry: two and a half to the
default gone-after. A failed beat is tried again after BEAT_AGAIN."""
BEAT_AGAIN = 0.5
"""Seconds before a registry beat that failed is tried again."""
LOOKS = 2
"""Looks at the tasks held (`give_back_undriven`) at the beats after a start or after a
claim that failed: a claim whose answer was lost may have made a task held and not driven
(the ledger finds one so at two looks in a row)."""
DEFAULT_GONE_AFTER = 5.0
"""Seconds without a heartbeat after which a scheduler instance is gone: the supervisor gives
its tasks back for another scheduler to resume."""
ADMIT_BATCH = 25
"""A scheduler whose agents have room for fewer tasks than this waits ROOM_EVERY once before
claiming them: claims of one or two tasks each would cost a commit each."""
VERSIONS_EVERY = 60.0
"""Seconds between two looks (the first at start) for tasks of a scheduler's workflows at
versions it does not have, each logged as a warning while any wait."""


class Scheduler:
    def __init__(
        self,
        store: SchedulerPort,
        workflows: Mapping[tuple[str, int], Workflow],
        *,
        instance: str,
        concurrency: int = 1000,
        poll_interval: float | None = None,
        operations: Mapping[str, AnyOperation] | None = None,
        admission: bool = True,
        heartbeat: float = DEFAULT_HEARTBEAT,
        gone_after: float = DEFAULT_GONE_AFTER,
        versions_every: float = VERSIONS_EVERY,
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.metrics = metrics or Metrics()
        """Where it counts tasks claimed, ended and run (its worker's)."""
        self.metrics.watch_scheduler(self)
        self.heartbeat = heartbeat
        self.gone_after = gone_after
        self.versions_every = versions_every
        self.workflows = dict(workflows)
        """What this scheduler runs, by (workflow, version): it claims those tasks only."""
        for key, wf in self.workflows.items():
            if key != wf.key:
                raise ValueError(f"workflow {wf.name!r} version {wf.version} filed as {key}")
        self.operations = operations
        """The operations of the App's agents by "agent.operation"; None accepts any."""
        self.instance = instance
        self.concurrency = concurrency
        self.admission = admission
        self._room_left: int | None = None
        self._room_at = float("-inf")
        self._waited = False
        """Claim no more tasks than the agents have room for (`Store.agent_room`): a task
        left pending has no deadline running, a step queued behind full agents has."""
        self.poll_interval = poll_interval or store.default_poll_interval
        self._pace = Pace(self.poll_interval, lambda: store.wakeups_live)
        """How long the claim loop waits for a wake-up before it claims anyway."""
        self._running: set[asyncio.Task[None]] = set()
        """The runs of the drives under way: those of drives a newer claim of their task
        stopped too, until they end (a drain waits for them all)."""
        self._drives: dict[str, TaskDrive] = {}
        """The drive of each task held, by task id: the one place where a task's state lives
        (a task claimed again, released meanwhile, stops its older, fenced-out drive)."""
        self._room = asyncio.Event()
        self._writes: Batcher[Entry, Any] = Batcher(self._write_group, yields=3)
        """The group commit of the drives' writes with the outcomes they go on from."""
        self.local_agents: dict[str, LocalAgent] = {}
        """This process's agent instances by agent name (set by the worker): a new step of
        an operation one of them has room for is handed to it at once."""
        self._ledger = _Ledger()
        """Which tasks it drove, for `give_back_undriven`."""
        self._looks = LOOKS
        """Looks at its tasks still to make at its next beats (`LOOKS`)."""

    def workflow_of(self, held: Held) -> Workflow:
        return self.workflows[(held.workflow, held.version)]

    def tasks_held(self) -> int:
        """The tasks it drives now (a gauge of its metrics)."""
        return len(self._drives)

    # -- the loops ------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event, *, drain_timeout: float = 30.0) -> None:
        """Register, then claim and drive tasks until `stop` is set; then let the workflows
        under way finish (up to `drain_timeout` seconds) and give back the tasks still held,
        for another scheduler to resume at once."""
        if not await self._register(stop):
            return
        results = asyncio.create_task(self._watch_results())
        beats = asyncio.create_task(self._heartbeats())
        versions = asyncio.create_task(self._watch_versions())
        try:
            await self._claim_loop(stop)
            if self._running:
                await asyncio.wait(set(self._running), timeout=drain_timeout)
            for task in set(self._running):
                task.cancel()
            if self._running:
                await asyncio.wait(set(self._running))
            await self._writes.drain()
        finally:
            for task in await cancel_until_ended(results, beats, versions):
                logger.warning(
                    "scheduler %s: %s went on after it was cancelled: cancelled again",
                    self.instance,
                    task.get_coro().__qualname__,  # type: ignore[union-attr]
                )
            await self._leave()

    # -- the registry ---------------------------------------------------------------------
    def _beat(self) -> SchedulerBeat:
        return SchedulerBeat(
            instance=self.instance,
            workflows=tuple(sorted({name for name, _ in self.workflows})),
            capacity=self.concurrency,
            held=len(self._running),
            versions=tuple(sorted(self.workflows)),
        )

    async def _register(self, stop: asyncio.Event) -> bool:
        """Register in the store before claiming anything, trying until it works (False
        when stopped first)."""
        failures = 0
        while not stop.is_set():
            try:
                await self.store.beat_schedulers([self._beat()], self.gone_after)
                return True
            except StoreError as exc:
                failures += 1
                what = f"scheduler {self.instance}: cannot register"
                await self.store.wait_to_retry(
                    after_store_failure(logger, what, exc, failures), stop
                )
        return False

    async def _heartbeats(self) -> None:
        failed = False
        while True:
            # Reckoned just before sleeping: the beat due at the next multiple of the period,
            # with the process's other beats (one transaction), not as late as this one's
            # write took.
            pause = until_beat(self.heartbeat)
            await asyncio.sleep(min(pause, BEAT_AGAIN) if failed else pause)
            try:
                await self.store.beat_schedulers([self._beat()], self.gone_after)
            except StoreError as exc:
                logger.warning("scheduler %s: heartbeat failed: %s", self.instance, exc)
                failed = True
                continue
            failed = False
            if not self._looks:
                continue
            await asyncio.sleep(spread())  # not at the instant the process's agents look
            try:
                await self.give_back_undriven()
            except StoreError as exc:
                logger.warning("scheduler %s: cannot read its tasks: %s", self.instance, exc)

    async def give_back_undriven(self) -> list[Released]:
        """Give back the tasks this instance holds, in time, that it has not driven under
        their attempt, seen so at two looks in a row (a claim answered meanwhile is driven by
        the second): a claim whose commit was made but whose answer was lost leaves them so,
        and they would wait for their complete_by. A task whose drive here stopped, leaving
        it to the supervisor, is not given back (its failure is counted at its deadline)."""
        drove = self._ledger.driven()
        held = await self.store.held_tasks(self.instance)
        twice = self._ledger.undriven(drove, held, self._drives)
        # Another look while one is found undriven once (the next gives it back).
        self._looks = max(self._looks - 1, 1 if self._ledger.suspects() else 0)
        if not twice:
            return []
        released = await self.store.release_held(self.instance, only=twice)
        for r in released:
            logger.warning(
                "task %s: held by this scheduler but not driven (word of its claim was lost); "
                "given back (now %s)",
                r.task_id,
                r.process_state,
            )
        return released

    async def _watch_versions(self) -> None:
        """Say, as a warning every `versions_every` seconds (the first at start), which tasks
        of this scheduler's workflows wait at a version it does not have: it leaves them to
        a scheduler with that version, and there may be none."""
        names = sorted({name for name, _ in self.workflows})
        await asyncio.sleep(spread())
        while True:
            try:
                backlog = await self.store.version_backlog(names)
            except StoreError as exc:
                logger.debug("scheduler %s: cannot read the backlog: %s", self.instance, exc)
                backlog = []
            for b in unrunnable(backlog, self.workflows):
                have = sorted(v for name, v in self.workflows if name == b.workflow)
                logger.warning(
                    "scheduler %s: %d task(s) of workflow %r version %d wait for a scheduler "
                    "with that version (this one runs %s %s of it)",
                    self.instance,
                    b.tasks,
                    b.workflow,
                    b.version,
                    "version" if len(have) == 1 else "versions",
                    ", ".join(str(v) for v in have),
                )
            await asyncio.sleep(self.versions_every)

    async def _leave(self) -> None:
        """Give back the tasks still held (their workflows were stopped) and leave the
        registry, so that nothing waits for this instance to be found gone."""
        try:
            released = await self.store.release_held(self.instance)
            await self.store.leave_scheduler(self.instance)
        except StoreError as exc:  # the supervisor gives them back once this one is gone
            logger.warning("scheduler %s: cannot hand back its tasks: %s", self.instance, exc)
            return
        if released:
            logger.info(
                "scheduler %s: handed back %d task(s) still held",
                self.instance,
                len(released),
            )

    async def _claim_loop(self, stop: asyncio.Event) -> None:
        sub = self.store.subscribe(CHANNEL_TASKS)
        names = sorted(self.workflows)  # (workflow, version): the tasks this one may run
        failures = 0
        last_claimed: int | None = None  # what the last claim took, of what it asked for
        last_asked = 0
        await sleep_unless(stop, spread())  # not at the instant the process's agents claim
        try:
            while not stop.is_set():
                free = self.concurrency - len(self._running)
                if free <= 0:
                    self._room.clear()
                    await first(stop.wait(), self._room.wait())
                    continue
                limit = min(free, 200)
                try:
                    if self.admission:
                        admitted = await self._admit(limit)
                        if admitted < min(limit, ADMIT_BATCH) and not self._waited:
                            # The agents are full, or nearly: let room gather for a while
                            # rather than claim a task or two at a time (once, then claim
                            # what there is).
                            self._waited = True
                            await sleep_unless(stop, ROOM_EVERY)
                            continue
                        self._waited = False
                        if admitted <= 0:
                            continue
                        limit = admitted
                    claimed_at = asyncio.get_running_loop().time()
                    fairly = claim_fairly(last_claimed=last_claimed, last_asked=last_asked)
                    claimed = await self.store.claim_tasks(
                        self.instance, names, limit, fairly=fairly
                    )
                    last_claimed, last_asked = len(claimed), limit
                    if self._room_left is not None:
                        self._room_left -= len(claimed)
                    failures = 0
                except StoreError as exc:
                    failures += 1
                    self._looks = LOOKS  # its answer lost, it may have claimed all the same
                    what = "scheduler: cannot claim tasks"
                    await self.store.wait_to_retry(
                        after_store_failure(logger, what, exc, failures), stop
                    )
                    continue
                self.metrics.tasks_claimed(c.task.workflow for c in claimed)
                for c in claimed:
                    self._start(TaskDrive(self, c))
                if claimed:
                    self._pace.busy()
                if len(claimed) < limit:
                    await first(stop.wait(), self._woken(sub))
                    if len(self._running) > 1:  # busy: let submits gather (Store.claim_gather)
                        since = asyncio.get_running_loop().time() - claimed_at
                        if since < self.store.claim_gather:
                            await sleep_unless(stop, self.store.claim_gather - since)
        finally:
            self.store.unsubscribe(CHANNEL_TASKS, sub)

    async def _woken(self, sub: Subscription) -> None:
        """Wait for word of tasks to claim (`_pace`: a poll interval, or the fallback's)."""
        if await sub.wait(self._pace.wait()) is not None:
            self._pace.busy()

    async def _admit(self, limit: int) -> int:
        """How many tasks to claim: `limit`, or fewer when the agents are full. The agents'
        room is read at most every ROOM_EVERY seconds, and counted down by the claims made
        in between (another scheduler's claims are seen at the next read)."""
        now = asyncio.get_running_loop().time()
        if now - self._room_at >= ROOM_EVERY:
            self._room_left = await self.store.agent_room()
            self._room_at = now
        return limit if self._room_left is None else min(limit, self._room_left)

    def _start(self, drive: TaskDrive) -> None:
        older = self._drives.get(drive.task_id)
        if older is not None and older.run_task is not None:
            older.run_task.cancel()
        self._ledger.drove(drive.held)
        drive.run_task = task = asyncio.create_task(drive.run())
        self._drives[drive.task_id] = drive
        self._running.add(task)
        task.add_done_callback(partial(self._done, drive))

    def _done(self, drive: TaskDrive, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self.metrics.task_ran(drive.held.workflow, drive.outcome, time.monotonic() - drive.began)
        if self._drives.get(drive.task_id) is drive:
            del self._drives[drive.task_id]
        self._room.set()
        if not task.cancelled() and task.exception() is not None:
            logger.error("scheduler: driving a task failed", exc_info=task.exception())

    async def _watch_results(self) -> None:
        """Resolve the steps workflows wait for: at once on a wake-up naming them, and by a
        full poll every so often for results whose wake-up did not reach this process."""
        sub = self.store.subscribe(CHANNEL_RESULTS)
        loop = asyncio.get_running_loop()
        full_every = max(self.poll_interval, 0.2)
        last_full = loop.time()
        try:
            while True:
                payloads = await sub.wait(full_every)
                # An empty wake-up: some may have been missed (`Store.wakeups_live`).
                if not payloads or loop.time() - last_full >= full_every:
                    last_full = loop.time()
                    wanted = [w for d in self._drives.values() for w in d.waited()]
                else:
                    wanted = [w for w in map(step_of_key, payloads) if self._waits_for(*w)]
                if not wanted:
                    continue
                try:
                    found = await self.store.finished_steps(wanted)
                except StoreError as exc:
                    logger.warning("scheduler: cannot read step results: %s", exc)
                    await asyncio.sleep(min(1.0, full_every))
                    continue
                for record in found:
                    drive = self._drives.get(record.task_id)
                    if drive is not None:
                        drive.resolve(record)
        finally:
            self.store.unsubscribe(CHANNEL_RESULTS, sub)

    def _waits_for(self, task_id: str, seq: int) -> bool:
        drive = self._drives.get(task_id)
        return drive is not None and drive.waits_for(seq)

    # -- the group commit -----------------------------------------------------------------
    def commit(self, entry: Entry) -> Awaitable[Any]:
        """Hand a drive's write to the group commit (`drive.Host.commit`)."""
        return self._writes.submit(entry)

    async def _write_group(self, entries: Sequence[Entry]) -> list[Any]:
        """One transaction for the writes handed in together (`Store.advance`), each with
        the outcomes it rests on (the store applies no write of a task one of whose outcomes
        it refuses). A write whose try fails gets the exception, and its outcomes go back to
        their drive, to go with its write tried again."""
        out: list[Any] = [None] * len(entries)
        dispatches: list[tuple[int, StepDispatch]] = []
        finishes: list[tuple[int, TaskOutcome]] = []
        for i, e in enumerate(entries):
            if isinstance(e.write, TaskOutcome):
                finishes.append((i, e.write))
            elif e.write is not None:
                dispatches.append((i, e.write))
        carried = [(e.drive, u) for e in entries for u in e.carried]
        try:
            done, dispatched, finished = await self.store.advance(
                [u.outcome for _, u in carried],
                [d for _, d in dispatches],
                [f for _, f in finishes],
            )
        except TransientStoreError:
            for e in entries:  # tried again with their drive's next write, or alone
                if e.carried:
                    e.drive.carry_again(e.carried)
            raise
        except BaseException as exc:
            for _, u in carried:
                if not u.recorded.done():
                    if isinstance(exc, Exception):
                        u.recorded.set_exception(exc)
                    else:
                        u.recorded.cancel()
            raise
        for (drive, u), ok in zip(carried, done, strict=True):
            drive.answered(u, ok)
        for (i, _), got in zip(dispatches, dispatched, strict=True):
            out[i] = got
        for (i, _), ok in zip(finishes, finished, strict=True):
            out[i] = ok
        return out


class _Ledger:
    """Which tasks (task_id, attempt) a scheduler instance has driven and may still hold,
    for `Scheduler.give_back_undriven`: a task held by it that it has not driven, found so at
    two looks in a row, is given back."""

    def __init__(self) -> None:
        self._drove: set[tuple[str, int]] = set()
        """Forgotten once a look finds them no longer held."""
        self._undriven: set[tuple[str, int]] = set()
        """Those the last look found held by this instance and not driven by it."""

    def drove(self, held: Held) -> None:
        self._drove.add((held.task_id, held.attempt))

    def suspects(self) -> bool:
        """Whether the last look found a task held and not driven (to be looked at again)."""
        return bool(self._undriven)

    def driven(self) -> set[tuple[str, int]]:
        """What it drove so far, taken before a look reads the tasks held."""
        return set(self._drove)

    def undriven(
        self,
        drove: set[tuple[str, int]],
        held: list[tuple[str, int]],
        driving: Container[str],
    ) -> set[tuple[str, int]]:
        """Of the tasks held (task_id, attempt), those not driven at this look and the last,
        `drove` taken before `held` was read (a claim answered meanwhile is driven by the
        next look)."""
        self._drove -= drove - set(held)
        undriven = {
            (task_id, attempt)
            for task_id, attempt in held
            if task_id not in driving and (task_id, attempt) not in self._drove
        }
        twice, self._undriven = undriven & self._undriven, undriven - self._undriven
        return twice
