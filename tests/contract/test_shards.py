"""A store of shards (PostgreSQL databases named together): each task lives on the shard its
id's slot maps to, and is found from its id; a worker runs its roles on each shard served;
adding a shard moves no task and keeps submits idempotent; a process whose map is older
than a shard's is refused rather than place a task where it does not belong."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import httpx
import psycopg
import pytest
from click.testing import CliRunner

import stepwarden as sw
from stepwarden.cli import cli as main_cli
from stepwarden.dashboard import create_app
from stepwarden.placement import SLOTS, ShardMap, slot_of
from stepwarden.records import SchedulerBeat
from stepwarden.sealing import new_keyring
from stepwarden.store import ShardedStore, open_one, open_store

from ..conftest import pg_database, unique
from ..support.poll import until
from ..support.worker import FAST, running


@pytest.fixture
def shard_urls(pg_template: str, request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """Three fresh, migrated databases: two shards of a store, and one to add."""
    test = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:30]
    with (
        pg_database(unique(f"sw_t_{test}_a"), pg_template) as a,
        pg_database(unique(f"sw_t_{test}_b"), pg_template) as b,
        pg_database(unique(f"sw_t_{test}_c"), pg_template) as c,
    ):
        yield [a, b, c]


def ids_on(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {r[0] for r in conn.execute("SELECT task_id FROM stepwarden_tasks")}


def newest_generation(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT coalesce(max(generation), 0) FROM stepwarden_shard_map"
        ).fetchone()
    assert row is not None
    return int(row[0])


def shop(store: str) -> sw.App:
    app = sw.App("sharded", store=store)
    svc = app.agent("svc")

    @svc.operation
    async def double(call: sw.Call, n: int) -> int:
        return 2 * n

    @app.workflow(name="twice")
    async def twice(ctx: sw.Context, n: int) -> int:
        once: int = await ctx.step(double, n)
        twice: int = await ctx.step(double, once)
        return twice

    @app.workflow(name="parent")
    async def parent(ctx: sw.Context, n: int) -> int:
        child: int = await ctx.child("twice", n)
        return 1 + child

    return app


@pytest.fixture
async def sharded(shard_urls: list[str]) -> AsyncIterator[sw.App]:
    async with shop(" ".join(shard_urls[:2])) as app:
        yield app


def test_the_placement_is_the_same_everywhere_and_adding_a_shard_moves_an_even_share() -> None:
    # The slot is computed from the id alone (a digest, never Python's salted hash()).
    assert slot_of("order-42") == 499 and 0 <= slot_of("") < SLOTS
    two = ShardMap.first(["s1", "s2"])
    assert two.current.counts() == {"s1": 512, "s2": 512}
    three = two.with_shard("s3")
    assert three.current.counts() == {"s1": 342, "s2": 341, "s3": 341}
    moved = [s for s in range(SLOTS) if two.current.owner(s) != three.current.owner(s)]
    assert len(moved) == 341 and all(three.current.owner(s) == "s3" for s in moved)
    # A moved slot's tasks are looked for at its new owner, then where they were created.
    task = next(f"t{i}" for i in range(100) if slot_of(f"t{i}") in moved)
    assert three.owners(task) == ["s3", two.home(task)]
    with pytest.raises(sw.ConfigurationError, match="in the map already"):
        three.with_shard("s2")


async def test_tasks_spread_over_the_shards_and_a_worker_serves_each(
    sharded: sw.App, shard_urls: list[str]
) -> None:
    ids = [f"o-{i}" for i in range(40)]
    for i, task_id in enumerate(ids):
        await sharded.submit_async("twice", i, task_id=task_id)
    store = await sharded.store()
    assert isinstance(store, ShardedStore) and store.shard_map is not None
    on = {name: ids_on(url) for name, url in zip(store.names, shard_urls, strict=False)}
    # Each task on its home shard only, and both shards used.
    assert all(t in on[store.shard_map.home(t)] for t in ids)
    assert on["s1"].isdisjoint(on["s2"]) and on["s1"] and on["s2"]
    async with running(sharded):
        results = [await sharded.result_async(t, timeout=30) for t in ids]
    assert results == [4 * i for i in range(40)]
    # Reads across the shards: listed, counted, each found from its id.
    assert {t.task_id for t in await sharded.tasks_async(limit=100)} == set(ids)
    assert (await store.count_tasks())[sw.TaskState.PROCESSED] == 40
    assert (await sharded.status_async(ids[7])).result == 28
    # Each shard had its own supervisor leader.
    for url in shard_urls[:2]:
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM stepwarden_leases").fetchone() == (1,)


async def test_a_child_lives_on_its_parents_shard_and_is_found_from_its_id(
    sharded: sw.App, shard_urls: list[str]
) -> None:
    store = await sharded.store()
    assert isinstance(store, ShardedStore) and store.shard_map is not None
    # A parent whose child's id has its slot on the other shard.
    parent = next(
        f"p-{i}"
        for i in range(200)
        if store.shard_map.home(f"p-{i}") != store.shard_map.home(f"p-{i}:1")
    )
    await sharded.submit_async("parent", 5, task_id=parent)
    async with running(sharded):
        assert await sharded.result_async(parent, timeout=30) == 21
    [child] = await store.children(parent)
    home = shard_urls[store.names.index(store.shard_map.home(parent))]
    assert {parent, child.task_id} <= ids_on(home)
    assert (await sharded.status_async(child.task_id)).result == 20


async def test_a_worker_given_shards_serves_those_only(
    sharded: sw.App, shard_urls: list[str]
) -> None:
    store = await sharded.store()
    assert isinstance(store, ShardedStore) and store.shard_map is not None
    ids = [f"w-{i}" for i in range(20)]
    for task_id in ids:
        await sharded.submit_async("twice", 1, task_id=task_id)
    on_s1 = [t for t in ids if store.shard_map.home(t) == "s1"]
    async with running(sharded, dataclasses.replace(FAST, shards=frozenset({"s1"}))):
        for t in on_s1:
            await sharded.result_async(t, timeout=30)
    states = {t: (await sharded.status_async(t)).process_state for t in ids}
    assert all(states[t] == sw.TaskState.PROCESSED for t in on_s1)
    assert all(states[t] == sw.TaskState.PENDING for t in ids if t not in on_s1)
    with pytest.raises(sw.ConfigurationError, match="no shard s9"):
        await sw.Worker(sharded, dataclasses.replace(FAST, shards=frozenset({"s9"}))).run()


async def test_adding_a_shard_moves_no_task_and_submits_stay_idempotent(
    shard_urls: list[str],
) -> None:
    a, b, c = shard_urls
    ids = [f"x-{i}" for i in range(300)]
    async with shop(f"{a} {b}") as app:
        made = await app.submit_many_async([app.new_task("twice", 1, task_id=t) for t in ids])
        assert all(a.created for a in made)
        before = {url: ids_on(url) for url in (a, b)}
        store = await app.store()
        assert isinstance(store, ShardedStore)
        assert await store.add_shard(c) == "s3"
        assert await store.add_shard(c) == "s3"  # again: nothing more to do
    assert {url: ids_on(url) for url in (a, b)} == before and not ids_on(c)
    async with shop(f"{a} {b} {c}") as app:
        store = await app.store()
        assert isinstance(store, ShardedStore) and store.shard_map is not None
        assert store.shard_map.generation == 2
        moved = [t for t in ids if store.shard_map.home(t) == "s3"]
        assert len(moved) > 50
        # The same ids again: none created, none copied to the new shard; the same submit
        # where it lives (a shard that owned its slot before); another input conflicts.
        again = await app.submit_many_async([app.new_task("twice", 1, task_id=t) for t in ids])
        assert {a.outcome for a in again} == {"same"} and not ids_on(c)
        other = await app.submit_many_async([app.new_task("twice", 2, task_id=t) for t in moved])
        assert {(a.outcome, a.differs) for a in other} == {("conflict", ("input",))}
        with pytest.raises(sw.SubmitConflict, match=f"task {moved[0]!r} .*another input"):
            await app.submit_async("twice", 2, task_id=moved[0])
        assert not ids_on(c)
        for t in moved:
            assert (await app.status_async(t)).task_id == t
        # New ids go to their home, the new shard among them.
        new = [f"y-{i}" for i in range(100)]
        made = await app.submit_many_async([app.new_task("twice", 1, task_id=t) for t in new])
        assert all(a.created for a in made)
        assert ids_on(c) == {t for t in new if store.shard_map.home(t) == "s3"} != set()
        async with running(app):
            for t in [*moved[:5], *new[:5]]:
                assert await app.result_async(t, timeout=30) == 4


async def test_a_process_with_an_older_map_is_refused_not_misplaced(
    shard_urls: list[str],
) -> None:
    a, b, c = shard_urls
    async with shop(f"{a} {b}") as old:
        await old.submit_async("twice", 1, task_id="first")
        async with shop(f"{a} {b}") as adder:
            store = await adder.store()
            assert isinstance(store, ShardedStore)
            await store.add_shard(c)
            assert store.shard_map is not None
        bigger = ShardMap.first(["s1", "s2"]).with_shard("s3")
        moved = next(f"m-{i}" for i in range(100) if bigger.home(f"m-{i}") == "s3")
        # The old process's map sends it to s1 or s2: the shard's newer generation refuses
        # the submit, and the map read anew names a shard this process was not given.
        with pytest.raises(sw.ConfigurationError, match="the shard map names s1, s2, s3"):
            await old.submit_async("twice", 1, task_id=moved)
    assert moved not in ids_on(a) | ids_on(b) | ids_on(c)


async def test_what_a_sharded_store_refuses(sharded: sw.App, tmp_path: Any) -> None:
    with pytest.raises(sw.ConfigurationError, match="shards are PostgreSQL databases"):
        sw.App("x", store=f"sqlite:///{tmp_path}/a.db sqlite:///{tmp_path}/b.db")
    url = sharded.store_url.split()[0]
    with pytest.raises(sw.ConfigurationError, match="each database once"):
        open_store(f"{url} {url}")
    with pytest.raises(sw.ConfigurationError, match="not served by a sharded store"):
        async with sharded.transaction():
            pass
    with pytest.raises(sw.ConfigurationError, match="the store is one database"):
        app = shop(url)
        await sw.Worker(app, dataclasses.replace(FAST, shards=frozenset({"s1"}))).run()
    with pytest.raises(sw.ConfigurationError, match="one database: several URLs name shards"):
        open_one(sharded.store_url)
    # Resealing runs on each shard's own store, one at a time.
    command = ["--store", sharded.store_url, "reseal"]
    done = await asyncio.to_thread(
        CliRunner().invoke, main_cli, command, env={"STEPWARDEN_KEYS": new_keyring()}
    )
    assert done.exit_code == 1, done.output
    assert "reseal runs on one database: run it with each shard's URL" in done.output


async def test_the_cli_and_the_dashboard_read_across_the_shards(
    sharded: sw.App, shard_urls: list[str]
) -> None:
    store = await sharded.store()
    assert isinstance(store, ShardedStore) and store.shard_map is not None
    ids = [f"r-{i}" for i in range(12)]
    for task_id in ids:
        await sharded.submit_async("twice", 1, task_id=task_id)
    one_each = [next(t for t in ids if store.shard_map.home(t) == s) for s in ("s1", "s2")]
    web = create_app(sharded, token="t" * 20)
    transport = httpx.ASGITransport(app=web)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        listed = (await client.get("/api/tasks", params={"limit": 100})).json()
        assert {t["task_id"] for t in listed["tasks"]} == set(ids)
        for task_id in one_each:
            assert (await client.get(f"/api/tasks/{task_id}")).status_code == 200
            assert task_id in (await client.get(f"/tasks/{task_id}")).text
        for page in ("/", "/tasks", "/agents", "/alerts", "/schedules", "/metrics"):
            assert (await client.get(page)).status_code == 200, page

    async def cli(*args: str) -> str:
        command = ["--store", sharded.store_url, *args]
        done = await asyncio.to_thread(CliRunner().invoke, main_cli, command)
        assert done.exit_code == 0, done.output
        return done.output

    lines = (await cli("tasks", "--json")).splitlines()
    listed_ids = {json.loads(line)["task_id"] for line in lines}
    assert listed_ids == set(ids)
    for task_id in one_each:
        assert json.loads(await cli("show", task_id, "--json"))["task_id"] == task_id
    shown = [json.loads(line) for line in (await cli("shards", "--json")).splitlines()]
    assert [(s["shard"], s["tasks"]) for s in shown] == [
        ("s1", len(ids_on(shard_urls[0]))),
        ("s2", len(ids_on(shard_urls[1]))),
    ]


async def test_a_new_generation_waits_for_the_submits_under_the_older_one(
    shard_urls: list[str],
) -> None:
    a, b, c = shard_urls
    async with shop(f"{a} {b}") as app:
        store = await app.store()
        assert isinstance(store, ShardedStore)
        with psycopg.connect(a) as submit:
            # A submit's transaction on s1 that has read the map's generation, not committed.
            submit.execute("SELECT coalesce(max(generation), 0) FROM stepwarden_shard_map")
            adding = asyncio.create_task(store.add_shard(c))

            def add_waits() -> bool:
                with psycopg.connect(a) as look:
                    row = look.execute(
                        "SELECT count(*) FROM pg_locks WHERE NOT granted"
                        " AND mode = 'AccessExclusiveLock'"
                        " AND relation = 'stepwarden_shard_map'::regclass"
                    ).fetchone()
                return row is not None and row[0] == 1

            async with asyncio.timeout(10):
                while not add_waits():
                    assert not adding.done(), adding
                    await asyncio.sleep(0.01)
            # The new generation is not written while the submit is open...
            assert not adding.done()
            assert newest_generation(b) == 1
            submit.commit()  # ...and is once it commits.
        assert await adding == "s3"
    assert [newest_generation(url) for url in (a, b, c)] == [2, 2, 2]


async def test_schedules_are_kept_and_ticked_on_the_first_shard_only(
    shard_urls: list[str],
) -> None:
    a, b, _ = shard_urls
    app = shop(f"{a} {b}")
    app.schedule("every-second", "twice", every=timedelta(seconds=1), input=1)
    async with app, running(app):

        async def ticked_twice() -> bool:
            return len(ids_on(a)) >= 2

        await until(ticked_twice)
        assert [s.name for s in await app.schedules_async()] == ["every-second"]
        await app.pause_schedule_async("every-second")
    with psycopg.connect(b) as conn:
        assert conn.execute("SELECT count(*) FROM stepwarden_schedules").fetchone() == (0,)
    assert not ids_on(b)
    assert all(t.startswith("every-second@") for t in ids_on(a))
    with psycopg.connect(a) as conn:
        assert conn.execute("SELECT paused FROM stepwarden_schedules").fetchone() == (True,)


async def test_a_database_with_tasks_becomes_the_first_shard_and_keeps_them(
    shard_urls: list[str],
) -> None:
    a, b, c = shard_urls
    ids = [f"old-{i}" for i in range(60)]
    async with shop(b) as alone:  # a store of one database, used for a while
        await alone.submit_many_async([alone.new_task("twice", 1, task_id=t) for t in ids])
    async with shop(c) as other:
        await other.submit_async("twice", 1, task_id="elsewhere")
    # Two databases with tasks: refused, and nothing written to either.
    with pytest.raises(sw.ConfigurationError, match="hold tasks already"):
        async with shop(f"{b} {c}") as both:
            await both.store()
    assert newest_generation(b) == 0 == newest_generation(c)
    async with shop(f"{a} {b}") as app:
        store = await app.store()
        assert isinstance(store, ShardedStore) and store.shard_map is not None
        # b, which holds tasks, is s1 and owned every slot in generation 1; a was added.
        assert store.names == ["s2", "s1"] and store.shard_map.generation == 2
        again = await app.submit_many_async([app.new_task("twice", 1, task_id=t) for t in ids])
        assert {a.outcome for a in again} == {"same"} and ids_on(b) == set(ids)
        assert not ids_on(a)
        for t in ids[:5]:
            assert (await app.status_async(t)).task_id == t
        new = [f"new-{i}" for i in range(40)]
        await app.submit_many_async([app.new_task("twice", 1, task_id=t) for t in new])
        assert ids_on(a) and ids_on(a) <= set(new)


async def test_why_a_task_waits_is_read_on_its_shard_with_that_shard_s_registry(
    sharded: sw.App,
) -> None:
    """Each shard has its own schedulers: a task waits for one of its own shard's."""
    ids = [f"w-{i}" for i in range(8)]
    for task_id in ids:
        await sharded.submit_async("twice", 1, task_id=task_id)
    store = await sharded.store()
    assert isinstance(store, ShardedStore)
    [first, *_] = store.parts
    await first.beat_schedulers(
        [SchedulerBeat(instance="s1-only", workflows=("twice",), capacity=1, held=0,
                       versions=(("twice", 1),))],
        ttl=60,
    )  # fmt: skip
    assert store.shard_map is not None
    homes = {store.shard_map.home(t) for t in ids}
    assert homes == set(store.names[:2])  # both shards hold some of them
    for task_id in ids:
        why = await sharded.why_async(task_id)
        if store.shard_map.home(task_id) == store.names[0]:
            assert why.gate.reason == sw.WaitReason.RANKED
            assert why.gate.schedulers == ("s1-only",)
        else:
            assert why.gate.reason == sw.WaitReason.NO_SCHEDULER
    with pytest.raises(sw.TaskNotFound):
        await sharded.why_async("no-such-task")


async def test_a_bulk_action_reaches_the_matching_tasks_of_every_shard_by_id(
    sharded: sw.App,
) -> None:
    ids = [f"b-{i:02}" for i in range(12)]
    for i, task_id in enumerate(ids):
        await sharded.submit_async("twice", i, task_id=task_id, tags={"half": str(i % 2)})
    even = sw.TaskFilter(tags={"half": "0"})
    plan = await sharded.bulk_plan_async(even, "pause")
    assert (plan.matched, plan.sample) == (6, ("b-00", "b-02", "b-04", "b-06", "b-08"))
    first = await sharded.bulk_async(even, "pause", batch=2, limit=4)
    assert (first.acted, first.last, first.done) == (4, "b-06", False)
    rest = await sharded.bulk_async(even, "pause", batch=2)
    assert (rest.acted, rest.last, rest.done) == (2, "b-10", True)
    states = {t.task_id: t.process_state for t in await sharded.tasks_async(limit=100)}
    assert {t for t, s in states.items() if s == sw.TaskState.PAUSED} == set(ids[::2])


async def test_tasks_are_listed_by_filter_a_page_at_a_time_across_the_shards(
    sharded: sw.App, shard_urls: list[str]
) -> None:
    """Oldest first over every shard, each page going on after the last task of the one
    before, whichever shard holds that task; by tag too."""
    ids = [f"p-{i:02}" for i in range(12)]
    for i, task_id in enumerate(ids):
        await sharded.submit_async("twice", i, task_id=task_id, tags={"half": str(i % 2)})
    assert {ids_on(url).isdisjoint(ids) for url in shard_urls[:2]} == {False}  # both hold some
    pages: list[list[str]] = []
    after = None
    while True:
        page = await sharded.tasks_matching_async(sw.TaskFilter(), after=after, limit=5)
        pages.append([t.task_id for t in page])
        if len(page) < 5:
            break
        after = page[-1].task_id
    assert pages == [ids[:5], ids[5:10], ids[10:]]
    even = sw.TaskFilter(tags={"half": "0"}, states=frozenset({sw.TaskState.PENDING}))
    first = await sharded.tasks_matching_async(even, limit=2)
    rest = await sharded.tasks_matching_async(even, after=first[-1].task_id)
    assert [t.task_id for t in [*first, *rest]] == ids[::2]
    with pytest.raises(sw.TaskNotFound, match="no task 'gone'"):
        await sharded.tasks_matching_async(sw.TaskFilter(), after="gone")
