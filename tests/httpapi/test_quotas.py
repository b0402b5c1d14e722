"""Each client within its bounds, attacked as a client with a weaker token would, over real
HTTP against a real server, on both stores: its submits a second and bytes a second, an
input's size, its priorities, its unfinished tasks (under concurrent submits too), its long
polls and streams at once; an agent client's registrations, their capacity and ttl. The
defaults alone stop what the review's floods did, and a bound set in the tokens file is
taken up without a restart."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from ..rawsql import sql
from .conftest import TIMEOUT, Served, Tokens, new_client, serving, until

AGENTS = "/api/v1/agents"


def write_tokens(path: Path, clients: Mapping[str, Iterable[str]], defaults: str = "") -> Tokens:
    """A tokens file of these clients (scopes and `SETTING=VALUE`s), with a defaults line."""
    made = {name: new_client(name, spec) for name, spec in clients.items()}
    lines = [f"defaults {defaults}"] if defaults else []
    lines += [client.line() for _, client in made.values()]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return Tokens(path, {name: token for name, (token, _) in made.items()})


@contextlib.contextmanager
def served_with(
    store_url: str, tmp_path: Path, clients: Mapping[str, Iterable[str]], defaults: str = ""
) -> Iterator[tuple[Served, Tokens]]:
    """A server (no worker: the tasks stay unfinished) of these clients."""
    tokens = write_tokens(tmp_path / "api-tokens", clients, defaults)
    with serving(store_url, tokens.path, worker=False) as served:
        yield served, tokens


@contextlib.asynccontextmanager
async def http(served: Served) -> AsyncIterator[httpx.AsyncClient]:
    # Idle connections are dropped before the server closes them (uvicorn: after 5 s), so
    # that none is reused as the server closes it.
    limits = httpx.Limits(max_connections=200, keepalive_expiry=1.0)
    async with httpx.AsyncClient(base_url=served.url, timeout=TIMEOUT, limits=limits) as c:
        yield c


async def post(
    c: httpx.AsyncClient, tokens: Tokens, who: str, body: dict[str, Any]
) -> httpx.Response:
    return await c.post(
        "/api/v1/tasks", json={"workflow": "approval", **body}, headers=tokens.auth(who)
    )


def count(store_url: str, where: str = "") -> int:
    [(n,)] = sql(store_url, f"SELECT count(*) FROM stepwarden_tasks {where}")
    return int(n)


async def test_the_default_bounds_refuse_what_the_review_flooded_with(
    store_url: str, tmp_path: Path
) -> None:
    """A client with `submit` only, every setting its default: priority 2147483647, a 1 MB
    input, a stream of inputs past the bytes a second; an agent client's instance of ttl 3600
    and capacity 2**31-1. Each refused, naming its bound; nothing stored."""
    clients = {"flood": ["submit"], "agents": ["agent:desk"]}
    with served_with(store_url, tmp_path, clients) as (served, tokens):
        async with http(served) as c:
            high = await post(c, tokens, "flood", {"priority": 2**31 - 1})
            assert high.status_code == 422, high.text
            assert "setting priority" in high.json()["error"]
            big = await post(c, tokens, "flood", {"input": "x" * 1_000_000})
            assert big.status_code == 413, big.text
            assert "over this client's bound of 262144 (setting input_bytes)" in big.text
            assert count(store_url) == 0
            # 200 kB inputs, 30 at once: 6 MB, past what the bucket of bytes a second holds
            # (1 MiB) and takes in while they come (1 MiB a second).
            loop = asyncio.get_running_loop()
            started = loop.time()
            answers = await asyncio.gather(
                *(post(c, tokens, "flood", {"input": "y" * 200_000}) for _ in range(30))
            )
            took = loop.time() - started
            codes = sorted(a.status_code for a in answers)
            assert set(codes) <= {201, 429}, codes
            assert codes.count(201) * 200_002 <= 2**20 * (1 + took), (codes, took)
            if took < 4:  # 6 MB took in 4 s would leave nothing to refuse
                assert 429 in codes
            refused = next(a for a in answers if a.status_code == 429)
            assert "setting submit_bytes" in refused.json()["error"]
            assert int(refused.headers["retry-after"]) >= 1
            assert count(store_url) == codes.count(201)

            beat = {"instance": "agents/i-1", "operations": ["stamp"], "capacity": 1}
            for extra, bound in (({"ttl": 3600}, "ttl"), ({"capacity": 2**31 - 1}, "capacity")):
                answer = await c.post(
                    f"{AGENTS}/desk/beat",
                    json={**beat, "ttl": 30, **extra},
                    headers=tokens.auth("agents"),
                )
                assert answer.status_code == 422, answer.text
                assert f"(setting {bound})" in answer.json()["error"]
            [(n,)] = sql(store_url, "SELECT count(*) FROM stepwarden_agents")
            assert n == 0


async def test_a_clients_submits_and_bytes_a_second_are_its_settings(
    store_url: str, tmp_path: Path
) -> None:
    clients = {
        "slow": ["submit", "submit_rate=0.01"],  # one, then one every 100 s
        "thin": ["submit", "submit_bytes=1", "input_bytes=100"],  # 100 bytes, then 1 a second
        "other": ["submit", "submit_rate=0.01"],
    }
    with served_with(store_url, tmp_path, clients) as (served, tokens):
        async with http(served) as c:
            assert (await post(c, tokens, "slow", {})).status_code == 201
            second = await post(c, tokens, "slow", {})
            assert second.status_code == 429
            assert second.json()["error"].startswith(
                "this client may submit 0.01 task(s) a second (setting submit_rate)"
            )
            assert 50 <= int(second.headers["retry-after"]) <= 100  # 100 s less the time since
            # Each client's bucket is its own.
            assert (await post(c, tokens, "other", {})).status_code == 201

            sixty = "z" * 58  # "zzz...": 60 bytes as stored
            assert (await post(c, tokens, "thin", {"input": sixty})).status_code == 201
            after = await post(c, tokens, "thin", {"input": sixty})
            assert after.status_code == 429, after.text
            assert after.json()["error"] == (
                "this client may submit 1 bytes of task input a second (setting submit_bytes): "
                f"try again in {after.headers['retry-after']} s"
            )
            assert 5 <= int(after.headers["retry-after"]) <= 20  # 20 bytes, 1 a second
            too_big = await post(c, tokens, "thin", {"input": "z" * 200})
            assert too_big.status_code == 413
            assert "202 bytes, over this client's bound of 100" in too_big.text
        assert count(store_url) == 3


async def test_a_clients_priorities_are_its_setting(store_url: str, tmp_path: Path) -> None:
    clients = {"ranked": ["submit", "read", "priority=0..5"], "plain": ["submit"]}
    with served_with(store_url, tmp_path, clients, defaults="priority=-1..1") as (
        served,
        tokens,
    ):
        async with http(served) as c:
            for priority, code in ((5, 201), (6, 422), (-1, 422), (0, 201)):
                answer = await post(c, tokens, "ranked", {"priority": priority})
                assert answer.status_code == code, (priority, answer.text)
            refused = await post(c, tokens, "ranked", {"priority": 6})
            assert refused.json() == {
                "error": "priority 6 is outside this client's priorities, 0 to 5 (setting priority)"
            }
            # The defaults line's range for a client that sets none.
            assert (await post(c, tokens, "plain", {"priority": -1})).status_code == 201
            assert (await post(c, tokens, "plain", {"priority": 2})).status_code == 422
    assert count(store_url) == 3


async def test_a_clients_unfinished_tasks_stay_within_its_bound_under_concurrent_submits(
    store_url: str, tmp_path: Path
) -> None:
    clients = {"busy": ["submit", "cancel", "unfinished=5"], "idle": ["submit"]}
    with served_with(store_url, tmp_path, clients) as (served, tokens):
        async with http(served) as c:
            answers = await asyncio.gather(*(post(c, tokens, "busy", {}) for _ in range(30)))
            codes = [a.status_code for a in answers]
            assert codes.count(201) == 5 and codes.count(429) == 25, codes
            refused = next(a for a in answers if a.status_code == 429)
            assert "5 task(s) not finished, its bound (setting unfinished)" in refused.text
            assert refused.headers["retry-after"] == "1"
            assert count(store_url, "WHERE submitted_by = 'busy'") == 5
            # Another client's bound is its own.
            assert (await post(c, tokens, "idle", {})).status_code == 201
            # A task that finishes makes room, once the count is read again (within 1 s).
            first = next(a.json()["task_id"] for a in answers if a.status_code == 201)
            cancelled = await c.post(f"/api/v1/cancel/{first}", headers=tokens.auth("busy"))
            assert cancelled.status_code == 200, cancelled.text

            async def admitted() -> bool:
                answer = await post(c, tokens, "busy", {})
                assert answer.status_code in (201, 429), answer.text
                return answer.status_code == 201

            await until("a submit admitted once a task finished", admitted)
            assert (await post(c, tokens, "busy", {})).status_code == 429
    assert count(store_url, "WHERE submitted_by = 'busy'") == 6


async def test_a_clients_long_polls_and_streams_at_once_are_bounded(
    store_url: str, tmp_path: Path
) -> None:
    clients = {
        "waiter": ["submit", "read", "polls=2", "streams=1"],
        "other": ["read", "channels=waiter", "tenants=waiter"],
    }
    with served_with(store_url, tmp_path, clients) as (served, tokens):
        async with http(served) as c:
            task = (await post(c, tokens, "waiter", {"reply_to": "waiter"})).json()["task_id"]
            result = f"/api/v1/results/{task}"
            # Three at once: one is refused, the two others wait (a minute at most).
            polls = [
                asyncio.create_task(
                    c.get(result, params={"timeout": 60}, headers=tokens.auth("waiter"))
                )
                for _ in range(3)
            ]
            done, waiting = await asyncio.wait(polls, return_when=asyncio.FIRST_COMPLETED)
            [refused] = [d.result() for d in done]
            assert refused.status_code == 429, refused.text
            assert "this client has 2 polls open, its bound (setting polls)" in refused.text
            assert refused.headers["retry-after"] == "1"
            more = await c.get(result, params={"timeout": 1}, headers=tokens.auth("waiter"))
            assert more.status_code == 429
            # Answered at once, a result asks for no long poll.
            now = await c.get(result, params={"timeout": 0}, headers=tokens.auth("waiter"))
            assert now.status_code == 202
            # Another client's are its own.
            other = await c.get(result, params={"timeout": 0.1}, headers=tokens.auth("other"))
            assert other.status_code == 202
            for poll in waiting:  # their client gone, the server ends them
                poll.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)

            async def poll_again() -> bool:
                answer = await c.get(result, params={"timeout": 0.1}, headers=tokens.auth("waiter"))
                return answer.status_code == 202

            await until("a long poll once the others ended", poll_again)

            stream = f"/api/v1/messages/{task}"
            async with c.stream("GET", stream, headers=tokens.auth("waiter")) as first:
                assert first.status_code == 200
                second = await c.get(stream, headers=tokens.auth("waiter"))
                assert second.status_code == 429, second.text
                assert "(setting streams)" in second.text
                async with c.stream("GET", stream, headers=tokens.auth("other")) as theirs:
                    assert theirs.status_code == 200

            async def stream_again() -> bool:
                async with c.stream("GET", stream, headers=tokens.auth("waiter")) as again:
                    return again.status_code == 200

            await until("a stream once the other one ended", stream_again)


async def test_an_agent_clients_registrations_capacity_and_ttl_are_bounded(
    store_url: str, tmp_path: Path
) -> None:
    """1,500 registrations asked at once by one agent token, its bound 5: five alive, the
    rest refused; a beat of one alive adds nothing; one that leaves makes room."""
    clients = {
        "agents": ["agent:desk", "instances=5", "capacity=10", "ttl=60", "polls=1", "streams=1"],
        "others": ["agent:desk"],
    }
    with served_with(store_url, tmp_path, clients) as (served, tokens):
        async with http(served) as c:

            async def beat(n: int, who: str = "agents", **extra: Any) -> httpx.Response:
                body = {"instance": f"{who}/i-{n}", "operations": ["stamp"], "capacity": 10}
                return await c.post(
                    f"{AGENTS}/desk/beat",
                    json={"ttl": 60, **body, **extra},
                    headers=tokens.auth(who),
                )

            answers: dict[int, httpx.Response] = {}
            for batch in range(0, 1500, 50):  # 50 at once, within the server's backlog
                numbers = range(batch, batch + 50)
                answers |= zip(
                    numbers, await asyncio.gather(*(beat(n) for n in numbers)), strict=True
                )
            codes = [a.status_code for a in answers.values()]
            assert codes.count(204) == 5 and codes.count(429) == 1495, sorted(set(codes))
            refused = next(a for a in answers.values() if a.status_code == 429)
            assert "alive, its bound is 5 (setting instances)" in refused.text
            alive = [n for n, a in answers.items() if a.status_code == 204]
            [(rows,)] = sql(store_url, "SELECT count(*) FROM stepwarden_agents")
            assert rows == 5
            assert (await beat(alive[0], inflight=1)).status_code == 204  # alive: a beat
            assert (await beat(alive[0], capacity=11)).status_code == 422
            assert (await beat(alive[0], ttl=61)).status_code == 422
            assert (await beat(9999)).status_code == 429
            assert (await beat(1, "others")).status_code == 204  # another client's own
            left = await c.post(
                f"{AGENTS}/desk/leave",
                json={"instance": f"agents/i-{alive[0]}"},
                headers=tokens.auth("agents"),
            )
            assert left.status_code == 204
            assert (await beat(9999)).status_code == 204

            # One claim that waits, one wake-up stream, at once.
            # Two claims that wait, at once: one is refused, the other waits.
            claim = {"instance": f"agents/i-{alive[1]}", "operations": ["stamp"], "limit": 1}
            claims = [
                asyncio.create_task(
                    c.post(
                        f"{AGENTS}/desk/claim",
                        json={**claim, "wait": 30},
                        headers=tokens.auth("agents"),
                    )
                )
                for _ in range(2)
            ]
            done, waiting = await asyncio.wait(claims, return_when=asyncio.FIRST_COMPLETED)
            [refused] = [d.result() for d in done]
            assert refused.status_code == 429, refused.text
            assert "(setting polls)" in refused.text
            at_once = await c.post(
                f"{AGENTS}/desk/claim", json=claim, headers=tokens.auth("agents")
            )
            assert at_once.status_code == 200  # a claim that does not wait is no long poll
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)

            wakeups = f"{AGENTS}/desk/wakeups"
            params = {"instance": f"agents/i-{alive[1]}"}
            async with c.stream("GET", wakeups, params=params, headers=tokens.auth("agents")) as s:
                assert s.status_code == 200
                again = await c.get(wakeups, params=params, headers=tokens.auth("agents"))
                assert again.status_code == 429 and "(setting streams)" in again.text


async def test_a_client_posts_and_reads_only_on_the_channels_it_is_given(
    store_url: str, tmp_path: Path
) -> None:
    """By default a client's channels are named after it (NAME, NAME.*): one client cannot
    post into another's channel, nor read the status messages of a task on it, even one of a
    tenant it is granted."""
    clients = {
        "alpha": ["submit", "read"],
        "beta": ["submit", "read", "tenants=alpha"],
        "both": ["read", "channels=alpha.*,beta", "tenants=alpha"],
    }
    with served_with(store_url, tmp_path, clients) as (served, tokens):
        async with http(served) as c:
            for channel in ("beta", "beta.orders", "alphabet", "alpha-x"):
                answer = await post(c, tokens, "alpha", {"reply_to": channel})
                assert answer.status_code == 422, (channel, answer.text)
                assert answer.json()["error"] == (
                    f"the channel {channel!r} is not this client's: it may name {{client}}, "
                    "{client}.* ({client} for its name; setting channels)"
                )
            assert count(store_url) == 0
            for channel in ("alpha", "alpha.orders"):
                assert (await post(c, tokens, "alpha", {"reply_to": channel})).status_code == 201
            task = (await post(c, tokens, "alpha", {"reply_to": "alpha.x"})).json()["task_id"]
            messages = f"/api/v1/messages/{task}"
            theirs = await c.get(messages, headers=tokens.auth("beta"))
            assert theirs.status_code == 403
            assert "the channel 'alpha.x' is not this client's" in theirs.json()["error"]
            for who in ("alpha", "both"):
                async with c.stream("GET", messages, headers=tokens.auth(who)) as mine:
                    assert mine.status_code == 200, who
