"""A store of several PostgreSQL databases, the shards: each task lives on one, with its steps,
waits, events, children and status messages; where is placement's rule (`placement.py`).

This store is the application's and the operator's view: it submits (placed by the map),
finds a task from its id, sends events, applies operator actions, and reads across the shards
(lists merged). It is no Store: it serves the application's port and the reads
(`ports.ApplicationStore`), with the operator's lifecycle (open, migrate, the sealing keys,
purge), and no actor's port, so that an actor given it is a type error. A worker given
several stores runs its roles on each shard's own store (`parts`), so that each shard has
its own schedulers, agents and supervisor leader, and its limits are counted per shard. Of
what it serves, what no shard can answer whole is refused (ConfigurationError: a
transaction of the application's, a channel's status messages across shards), never
answered from one shard as if it were all.

The URL is the shards' URLs separated by whitespace. On first open the map is written to
every shard (generation 1: the slots dealt over the shards in the URL's order, named s1,
s2, ...); `add_shard` adds one later (`stepwarden shards add`).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from functools import partial
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ..errors import ConfigurationError, TaskNotFound, TransientStoreError
from ..placement import Generation, ShardMap
from ..records import (
    ActionOutcome,
    Activity,
    ActivityBucket,
    AgentInstance,
    EventBeyond,
    EventBounds,
    EventPage,
    EventRecord,
    LeaseRecord,
    OperatorAction,
    OpLimit,
    OutboxMessage,
    Redrive,
    RelayBacklog,
    ScheduleRecord,
    SchedulerInstance,
    SendOutcome,
    StepFacts,
    StepRecord,
    StepStats,
    Submission,
    Submitted,
    TaskFacts,
    TaskFilter,
    TaskRecord,
    TenantWeight,
    VersionBacklog,
    WaitRecord,
)
from ..rules import resubmit
from ..sealing import Keyring
from ..states import TaskState
from . import _rows, policy
from .base import Notifier, Store, Subscription

T = TypeVar("T")
logger = logging.getLogger("stepwarden.store")

SETTLE_WITHIN = 5.0
"""Seconds an open waits for shards whose maps disagree (a shard being added) to agree."""
LOCATED = 10_000
"""Task ids whose shard this process remembers (the newest found)."""


class MapChanged(ConfigurationError):
    """A shard map was written by another process since this one read it."""


def shard_urls(url: str) -> list[str]:
    """The URLs of a sharded store's URL (separated by whitespace); one URL: a list of one."""
    return url.split()


class ShardedStore:
    """Several PostgreSQL databases as one store for the application (see the module)."""

    dialect = "postgresql"
    default_poll_interval = 0.5  # PostgresStore's
    notifier: Notifier
    """This store's wake-ups, fed by every shard's (`subscribe`)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.notifier = Notifier()
        self.write_observer: Callable[[float], None] | None = None
        """Given to every shard's store when it opens (`Store.write_observer`)."""
        self._keys: Keyring | None = None
        urls = shard_urls(url)
        if len(urls) < 2:
            raise ConfigurationError("a sharded store names two PostgreSQL databases or more")
        for u in urls:
            if urlsplit(u).scheme not in ("postgresql", "postgres"):
                raise ConfigurationError(
                    "shards are PostgreSQL databases: every URL of a sharded store is "
                    f"postgresql://..., not {u.split(':', 1)[0]}:..."
                )
        if len(set(urls)) != len(urls):
            raise ConfigurationError("a sharded store names each database once")
        self.parts: list[Store] = [_postgres(u, self.keys) for u in urls]
        """Each shard's own store, in the URL's order, each with its own wake-ups (a
        subscription of this store's is fed by every shard's: `subscribe`)."""
        self.shard_map: ShardMap | None = None
        self.names: list[str] = []
        """Each part's name in the map, in the URL's order (once open)."""
        self._by_name: dict[str, Store] = {}
        self._located: OrderedDict[str, Store] = OrderedDict()

    @property
    def keys(self) -> Keyring | None:
        """The keyring of every shard's store."""
        return self._keys

    @keys.setter
    def keys(self, keys: Keyring | None) -> None:
        self._keys = keys
        for part in getattr(self, "parts", ()):
            part.keys = keys

    # -- lifecycle ------------------------------------------------------------------------
    async def open(self, *, migrate: bool = True) -> None:
        opened: list[Store] = []
        try:
            for part in self.parts:
                part.write_observer = self.write_observer
                await part.open(migrate=migrate)
                opened.append(part)
            await self._read_map(first=migrate)
        except BaseException:
            for part in opened:
                await part.close()
            raise

    async def close(self) -> None:
        for part in self.parts:
            await part.close()

    async def migrate(self) -> int:
        return min([await part.migrate() for part in self.parts])

    async def schema_version(self) -> int:
        return min([await part.schema_version() for part in self.parts])

    async def sealing_keys(self) -> list[str]:
        """The keys that sealed secrets on any shard."""
        found: dict[str, None] = {}
        for keys in await self._each(lambda p: p.sealing_keys()):
            found.update(dict.fromkeys(keys))
        return list(found)

    async def drop_sealing_keys(self, key_ids: Sequence[str]) -> None:
        await self._each(lambda p: p.drop_sealing_keys(key_ids))

    async def listen(self) -> None:
        """Listen on every shard; a shard out of reach is polled (and the first failure
        raised once the others listen)."""
        failed: BaseException | None = None
        for part in self.parts:
            try:
                await part.listen()
            except Exception as exc:
                failed = failed or exc
        if failed is not None:
            raise failed

    def subscribe(self, channel: str) -> Subscription:
        """Wake-ups of `channel` from every shard."""
        sub = self.notifier.subscribe(channel)
        for part in self.parts:
            part.notifier.subscribe(channel, sub)
        return sub

    def unsubscribe(self, channel: str, sub: Subscription) -> None:
        self.notifier.unsubscribe(channel, sub)
        for part in self.parts:
            part.notifier.unsubscribe(channel, sub)

    @property
    def schedules_shard(self) -> str:
        """The shard that keeps the schedules (the map's first): its supervisor ticks them,
        and their ticks' tasks live there."""
        return self._map().shards[0]

    def part(self, name: str) -> Store:
        """The store of the shard `name`."""
        try:
            return self._by_name[name]
        except KeyError:
            raise ConfigurationError(f"no shard {name!r} in this store") from None

    # -- the map --------------------------------------------------------------------------
    async def _states(self, parts: Sequence[Store]) -> list[tuple[str | None, list[Generation]]]:
        states = []
        for part in parts:
            named = await part._read_one("shard_name")
            stored = await part._read_one("shard_map")
            states.append((named[0]["name"] if named else None, _rows.generations(stored)))
        return states

    async def _read_map(self, *, first: bool) -> None:
        """Read the map from every shard: the same everywhere (waited for while a shard is
        being added), naming exactly these shards. Writes generation 1 when `first` and no
        shard has a map yet."""
        deadline = asyncio.get_running_loop().time() + SETTLE_WITHIN
        while True:
            states = await self._states(self.parts)
            names = [name for name, _ in states]
            newest = [gens[-1].number if gens else 0 for _, gens in states]
            if not any(names) and not any(newest):
                if not first:
                    raise ConfigurationError(
                        "these databases are not shards yet: open the store with migrations "
                        "on (the default) to set them up"
                    )
                with contextlib.suppress(MapChanged):  # another process wrote it first
                    await self._first_map()
                continue
            if len(set(newest)) == 1 and all(names):
                break
            if asyncio.get_running_loop().time() > deadline:
                shown = ", ".join(
                    f"{_shown(p.url)}: {n or 'no name'} at generation {g}"
                    for p, n, g in zip(self.parts, names, newest, strict=True)
                )
                raise ConfigurationError(
                    f"the shards do not agree on the shard map ({shown}): name every shard "
                    "of the store, and finish adding one with `stepwarden shards add`"
                )
            await asyncio.sleep(0.2)
        shard_map = ShardMap(tuple(states[0][1]))
        given = [str(n) for n in names]
        if sorted(given) != sorted(shard_map.shards) or len(set(given)) != len(given):
            raise ConfigurationError(
                f"the shard map names {', '.join(shard_map.shards)}; the store's URL gives "
                f"{', '.join(given)}: name each shard once, every one of them"
            )
        self.shard_map = shard_map
        self.names = given
        self._by_name = dict(zip(given, self.parts, strict=True))
        self._located.clear()

    async def _first_map(self) -> None:
        """Generation 1, written to every shard: the slots dealt evenly over empty
        databases. A database that holds tasks already becomes s1 and keeps every slot in
        generation 1; each other one is then added (a generation each) as `add_shard` does,
        so that its tasks are found, and their ids stay theirs, wherever their slots go.
        More than one database with tasks is refused."""
        holding = [p for p in self.parts if (await p._read_one("any_task"))[0]["present"]]
        if len(holding) > 1:
            shown = ", ".join(_shown(p.url) for p in holding)
            raise ConfigurationError(
                f"these databases hold tasks already: {shown}; a store of shards may start "
                "from one database with tasks (it becomes s1), the others empty"
            )
        order = holding + [p for p in self.parts if p not in holding]
        names = [f"s{i + 1}" for i in range(len(order))]
        if holding:
            shard_map = ShardMap.first(names[:1])
            for name in names[1:]:
                shard_map = shard_map.with_shard(name)
        else:
            shard_map = ShardMap.first(names)
        await self._write_map(shard_map, list(zip(order, names, strict=True)), {})

    async def _write_map(
        self, shard_map: ShardMap, named: Sequence[tuple[Store, str]], added: dict[str, bool]
    ) -> None:
        """Write `shard_map` to each (store, name) of `named`, all in transactions open
        together (each with its map locked) and committed when every one accepted it."""
        states = await self._states([store for store, _ in named])
        async with contextlib.AsyncExitStack() as stack:
            for (store, name), (_, gens) in zip(named, states, strict=True):
                tx = await stack.enter_async_context(store.transaction())
                flow = partial(
                    policy.write_shard_map,
                    name,
                    shard_map,
                    gens[-1].number if gens else 0,
                    added.get(name, False),
                )
                refused = await tx._run(flow)
                if refused is not None:
                    error = MapChanged if refused.changed else ConfigurationError
                    raise error(f"{_shown(store.url)}: {refused.reason}")

    async def add_shard(self, url: str) -> str:
        """Add the database at `url` (migrated here; it must hold no task) as a new shard: a
        new generation of the map gives it an even share of the slots, moving no task. Its
        name is returned. Safe to run again after a failure: shards left behind get the
        newest map first."""
        if self.shard_map is None:
            raise ConfigurationError("open the store before adding a shard")
        new = _postgres(url, self.keys)
        await new.open(migrate=True)
        try:
            everyone = [*self.parts, new]
            states = await self._states(everyone)
            newest = max(everyone, key=lambda s: len(states[everyone.index(s)][1]))
            best = ShardMap(tuple(states[everyone.index(newest)][1]))
            new_name = states[-1][0]
            if new_name is not None and new_name in best.shards:
                # Added already (maybe not everywhere): settle every shard on the newest map.
                named = [*zip(self.parts, self.names, strict=True), (new, new_name)]
                await self._write_map(best, named, {})
                return new_name
            if any(len(gens) != len(states[0][1]) for _, gens in states[:-1]):
                await self._write_map(best, list(zip(self.parts, self.names, strict=True)), {})
            name = best.next_name()
            bigger = best.with_shard(name)
            named = [*zip(self.parts, self.names, strict=True), (new, name)]
            await self._write_map(bigger, named, {name: True})
            logger.info(
                "shard %s added (%s): generation %d, %d of %d slots",
                name,
                _shown(url),
                bigger.generation,
                bigger.current.counts()[name],
                sum(bigger.current.counts().values()),
            )
            return name
        finally:
            await new.close()

    # -- placement ------------------------------------------------------------------------
    def _map(self) -> ShardMap:
        if self.shard_map is None:
            raise ConfigurationError("the sharded store is not open")
        return self.shard_map

    def _candidates(self, task_id: str) -> list[Store]:
        """Where a task may be: the owners of its slot, newest first, then the other shards
        (a child lives on its parent's shard, whatever its slot)."""
        owners = [self._by_name[n] for n in self._map().owners(task_id)]
        return owners + [p for p in self.parts if p not in owners]

    async def _find(self, task_id: str) -> tuple[Store, TaskRecord] | None:
        known = self._located.get(task_id)
        order = self._candidates(task_id)
        if known is not None:
            order = [known, *(p for p in order if p is not known)]
        for part in order:
            task = await part.get_task(task_id)
            if task is not None:
                self._located[task_id] = part
                self._located.move_to_end(task_id)
                while len(self._located) > LOCATED:
                    self._located.popitem(last=False)
                return part, task
        return None

    async def _shard_of(self, task_id: str) -> Store:
        """The task's shard, or its home when no shard holds it (which then answers as a
        single store does of an unknown task)."""
        found = await self._find(task_id)
        return found[0] if found else self._by_name[self._map().home(task_id)]

    # -- submits --------------------------------------------------------------------------
    async def submit(self, tasks: Sequence[Submission]) -> list[Submitted]:
        """Each task created at its id's home, unless a shard that owned its slot before
        holds it already (then compared with it, `rules.resubmit`); tried again with the map
        read anew when a shard holds a newer generation than this process read."""
        answers: dict[int, Submitted] = {}
        for _ in range(5):
            shard_map = self._map()
            todo = [i for i in range(len(tasks)) if i not in answers]
            groups: dict[str, list[int]] = {}
            for i in todo:
                owners = shard_map.owners(tasks[i].task_id)
                for older in owners[1:]:
                    part = self._by_name[older]
                    found = await part.get_task(tasks[i].task_id)
                    if found is not None:
                        answers[i] = resubmit(
                            tasks[i],
                            workflow=found.workflow,
                            version=found.version,
                            submitted_by=found.submitted_by,
                            tenant=found.tenant,
                            same_input=policy.same_input(tasks[i], found.input_digest, part.keys),
                        )
                        break
                else:
                    groups.setdefault(owners[0], []).append(i)

            async def one(name: str, indexes: list[int], shard_map: ShardMap = shard_map) -> bool:
                part = self._by_name[name]
                batch = [tasks[i] for i in indexes]
                flow = partial(policy.submit_fenced, shard_map.generation, batch, part.keys)
                got = await part._again_if_transient(lambda: part._write_alone(flow))
                if got is None:
                    return False
                answers.update(zip(indexes, got, strict=True))
                return True

            fresh = await asyncio.gather(*(one(n, ix) for n, ix in groups.items()))
            if all(fresh):
                return [answers[i] for i in range(len(tasks))]
            await self._read_map(first=False)
        raise TransientStoreError("the shard map kept changing while tasks were submitted")

    # -- one task -------------------------------------------------------------------------
    async def get_task(self, task_id: str) -> TaskRecord | None:
        found = await self._find(task_id)
        return found[1] if found else None

    async def await_task(self, task_id: str, *, created_here: bool = False) -> TaskRecord | None:
        found = await self._find(task_id)  # a read: the shard is found by the task's row
        return None if found is None else await found[0].await_task(task_id)

    async def get_steps(self, task_id: str) -> list[StepRecord]:
        return await (await self._shard_of(task_id)).get_steps(task_id)

    async def waits(self, task_id: str) -> list[WaitRecord]:
        return await (await self._shard_of(task_id)).waits(task_id)

    async def children(self, task_id: str, *, limit: int = 1000) -> list[TaskRecord]:
        return await (await self._shard_of(task_id)).children(task_id, limit=limit)

    async def history(
        self, task_id: str, *, limit: int = 100, before: int | None = None
    ) -> EventPage:
        return await (await self._shard_of(task_id)).history(task_id, limit=limit, before=before)

    async def fork(
        self,
        task_id: str,
        new: Submission,
        start: str,
        new_keys_from: int | None,
        detail: dict[str, Any],
        *,
        apply: bool,
    ) -> Redrive:
        raise ConfigurationError(
            "a fork is not made on a store of shards: it would be written on its original's "
            "shard, not where the shard map places its id"
        )

    async def send_event(
        self,
        task_id: str,
        name: str,
        payload: str,
        event_id: str,
        bounds: EventBounds | None = None,
    ) -> SendOutcome | TaskState | EventBeyond | None:
        part = await self._shard_of(task_id)
        return await part.send_event(task_id, name, payload, event_id, bounds)

    async def operate(self, actions: Sequence[OperatorAction]) -> list[ActionOutcome]:
        """Each shard's actions in one transaction of that shard's."""
        groups: dict[int, list[int]] = {}
        for i, action in enumerate(actions):
            groups.setdefault(self.parts.index(await self._shard_of(action.task_id)), []).append(i)
        outcomes: dict[int, ActionOutcome] = {}
        for index, positions in groups.items():
            done = await self.parts[index].operate([actions[i] for i in positions])
            outcomes.update(zip(positions, done, strict=True))
        return [outcomes[i] for i in range(len(actions))]

    async def outbox(
        self,
        *,
        task_id: str,
        channel: str | None = None,
        after: int = 0,
        limit: int = 100,
    ) -> list[OutboxMessage]:
        """A task's messages (its shard's). Message ids are each shard's own: a channel's
        messages from an id on are one shard's, read on that shard's store (`parts`); the
        store of shards serves no such read (the application's port asks for a task)."""
        part = await self._shard_of(task_id)
        return await part.outbox(channel=channel, task_id=task_id, after=after, limit=limit)

    # -- across the shards ----------------------------------------------------------------
    async def _each(self, read: Callable[[Store], Awaitable[T]]) -> list[T]:
        return list(await asyncio.gather(*(read(p) for p in self.parts)))

    async def list_tasks(
        self,
        *,
        state: TaskState | None = None,
        workflow: str | None = None,
        limit: int = 100,
        version: int | None = None,
        tenant: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> list[TaskRecord]:
        found = await self._each(
            lambda p: p.list_tasks(
                state=state,
                workflow=workflow,
                limit=limit,
                version=version,
                tenant=tenant,
                tags=tags,
            )
        )
        merged = heapq.merge(*found, key=lambda t: (t.created_at, t.task_id))
        return list(itertools.islice(merged, limit))

    async def list_matching(
        self,
        match: TaskFilter,
        *,
        after: str | None = None,
        limit: int = 100,
        after_at: datetime | None = None,
    ) -> list[TaskRecord]:
        if after is not None and after_at is None:
            cursor = await self.get_task(after)
            if cursor is None:
                raise TaskNotFound(f"no task {after!r} to list the tasks after")
            after_at = cursor.created_at  # the other shards compare with it
        found = await self._each(
            lambda p: p.list_matching(match, after=after, limit=limit, after_at=after_at)
        )
        merged = heapq.merge(*found, key=lambda t: (t.created_at, t.task_id))
        return list(itertools.islice(merged, limit))

    async def select_tasks(
        self, match: TaskFilter, *, after: str = "", limit: int = 100
    ) -> list[TaskRecord]:
        found = await self._each(lambda p: p.select_tasks(match, after=after, limit=limit))
        return list(itertools.islice(heapq.merge(*found, key=lambda t: t.task_id), limit))

    async def find_tasks(
        self,
        *,
        state: TaskState | None = None,
        workflow: str | None = None,
        search: str | None = None,
        limit: int = 100,
        version: int | None = None,
        tenant: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> list[TaskRecord]:
        found = await self._each(
            lambda p: p.find_tasks(
                state=state,
                workflow=workflow,
                search=search,
                limit=limit,
                version=version,
                tenant=tenant,
                tags=tags,
            )
        )
        merged = heapq.merge(*found, key=lambda t: (t.created_at, t.task_id), reverse=True)
        return list(itertools.islice(merged, limit))

    async def count_tasks(self) -> dict[TaskState, int]:
        counts = {s: 0 for s in TaskState}
        for each in await self._each(lambda p: p.count_tasks()):
            for state, n in each.items():
                counts[state] += n
        return counts

    async def client_unfinished(self, client: str) -> int:
        return sum(await self._each(lambda s: s.client_unfinished(client)))

    async def events(
        self, *, task_id: str | None = None, kind: str | None = None, limit: int = 1000
    ) -> list[EventRecord]:
        if task_id is not None:
            part = await self._shard_of(task_id)
            return await part.events(task_id=task_id, kind=kind, limit=limit)
        found = await self._each(lambda p: p.events(kind=kind, limit=limit))
        return list(itertools.islice(heapq.merge(*found, key=lambda e: e.at), limit))

    async def count_events(self, kind: str) -> int:
        return sum(await self._each(lambda p: p.count_events(kind)))

    async def newest_outbox(self, *, channel: str, limit: int) -> list[OutboxMessage]:
        found = await self._each(lambda p: p.newest_outbox(channel=channel, limit=limit))
        merged = heapq.merge(*found, key=lambda m: m.at, reverse=True)
        return list(itertools.islice(merged, limit))

    async def oldest_pending_age(self) -> float | None:
        ages = [a for a in await self._each(lambda p: p.oldest_pending_age()) if a is not None]
        return max(ages) if ages else None

    async def list_agents(self) -> list[AgentInstance]:
        return [a for each in await self._each(lambda p: p.list_agents()) for a in each]

    async def list_schedulers(self) -> list[SchedulerInstance]:
        return [s for each in await self._each(lambda p: p.list_schedulers()) for s in each]

    async def workflow_names(self) -> list[str]:
        names = await self._each(lambda p: p.workflow_names())
        return sorted({n for each in names for n in each})

    async def version_backlog(self, workflows: Sequence[str] | None = None) -> list[VersionBacklog]:
        merged: dict[tuple[str, int], VersionBacklog] = {}
        for each in await self._each(lambda p: p.version_backlog(workflows)):
            for b in each:
                had = merged.get((b.workflow, b.version))
                merged[(b.workflow, b.version)] = (
                    b
                    if had is None
                    else replace(
                        had,
                        pending=had.pending + b.pending,
                        compensating=had.compensating + b.compensating,
                        oldest=min(had.oldest, b.oldest),
                    )
                )
        return [merged[k] for k in sorted(merged)]

    async def why_facts(
        self, task_id: str, limits: Mapping[tuple[str, str], OpLimit] | None = None
    ) -> tuple[TaskFacts, list[StepFacts]] | None:
        # On the task's shard, with that shard's registries: its own schedulers and agents.
        return await (await self._shard_of(task_id)).why_facts(task_id, limits)

    async def relay_backlog(self) -> list[RelayBacklog]:
        return [b for each in await self._each(lambda p: p.relay_backlog()) for b in each]

    async def step_stats(self) -> list[StepStats]:
        merged: dict[tuple[str, str], StepStats] = {}
        for each in await self._each(lambda p: p.step_stats()):
            for s in each:
                had = merged.get((s.agent, s.operation))
                merged[(s.agent, s.operation)] = (
                    s
                    if had is None
                    else replace(
                        had,
                        started=had.started + s.started,
                        completed=had.completed + s.completed,
                        failed=had.failed + s.failed,
                        reassignments=had.reassignments + s.reassignments,
                        retried=had.retried + s.retried,
                        duration_buckets=tuple(
                            a + b
                            for a, b in zip(had.duration_buckets, s.duration_buckets, strict=True)
                        ),
                        duration_sum=had.duration_sum + s.duration_sum,
                    )
                )
        return [merged[k] for k in sorted(merged)]

    async def activity(self, *, window: float, bucket: float) -> Activity:
        each = await self._each(lambda p: p.activity(window=window, bucket=bucket))
        first = each[0]
        buckets = [
            ActivityBucket(
                start=b.start,
                processed=sum(a.buckets[i].processed for a in each if i < len(a.buckets)),
                failed=sum(a.buckets[i].failed for a in each if i < len(a.buckets)),
            )
            for i, b in enumerate(first.buckets)
        ]
        return replace(first, buckets=buckets)

    async def set_tenant_weight(self, tenant: str, weight: float) -> None:
        """On every shard: each shares its own claims among the tenants fairly."""
        await self._each(lambda p: p.set_tenant_weight(tenant, weight))

    async def tenant_weights(self) -> list[TenantWeight]:
        """The first shard's rows (the weights are set on every shard alike)."""
        return await self.parts[0].tenant_weights()

    async def purge(self, older_than: float, limit: int, tenant: str | None = None) -> int:
        return sum(await self._each(lambda p: p.purge(older_than, limit, tenant)))

    # -- what lives on the first shard: schedules, and the lease shown -------------------
    def _first(self) -> Store:
        return self._by_name[self.schedules_shard]

    async def schedules(self) -> list[ScheduleRecord]:
        """The schedules, kept on the map's first shard (s1), where their ticks' tasks live."""
        return await self._first().schedules()

    async def pause_schedule(self, name: str, paused: bool) -> bool:
        return await self._first().pause_schedule(name, paused)

    async def read_lease(self, name: str) -> LeaseRecord | None:
        """The lease on the map's first shard (each shard has its own leader: `part`)."""
        return await self._first().read_lease(name)


def _postgres(url: str, keys: Keyring | None) -> Store:
    """One shard's store (the postgres extra is needed for shards only)."""
    from . import open_one

    return open_one(url, keys=keys)


def _shown(url: str) -> str:
    """The host, port and database of a URL (never its user or password)."""
    parts = urlsplit(url)
    return f"{parts.hostname or ''}:{parts.port or 5432}{parts.path}"


__all__ = ["ShardedStore", "shard_urls"]
