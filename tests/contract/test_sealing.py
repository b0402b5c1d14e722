"""Secrets sealed at rest, on each store: a dump of the store (the SQLite file, `pg_dump`)
holds none of a task's secrets, yet the workflow and its operations get them; a sealed value
copied to another record does not open; a wrong keyring, or none, is refused; `reseal` moves
every value to the newest key and seals what was stored plain, and a task sealed under an
older key still runs once that key is gone."""

from __future__ import annotations

import asyncio
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

import stepwarden as sw

from ..cli.helpers import invoke
from ..rawsql import is_sqlite, sql
from ..support.apps import keyring
from ..support.worker import FAST, running

PIN = "PIN-7391-secret"
CARD = "4111-0000-1111-2222"
TOKEN = "tok-88fd0ab1-secret"


class Vault:
    """An App whose task takes a PIN in its input, hands it to a step, takes a card in an
    event, gets a token back from its step, and returns a secret."""

    def __init__(self, store_url: str, keys: sw.Keyring | None) -> None:
        self.app = sw.App("vault", store=store_url, keys=keys)
        self.seen: list[Any] = []
        bank = self.app.agent("bank")

        @bank.operation
        async def check(call: sw.Call, pin: sw.Secret[str], card: sw.Secret[str]) -> Any:
            self.seen.append((pin.reveal(), card.reveal()))
            return {"token": sw.Secret(TOKEN)}

        @self.app.workflow(complete_within=timedelta(seconds=30))
        async def open_account(ctx: sw.Context, order: dict[str, Any]) -> Any:
            card = await ctx.wait_for_event("card", timeout=timedelta(seconds=60))
            got = await ctx.step(bank.check, order["pin"], card["card"])
            self.seen.append(got["token"].reveal())
            return {"token": got["token"], "id": order["id"]}

        self.open_account = open_account


def dump(url: str) -> bytes:
    """Everything the store holds on disk, as a thief of a backup would read it."""
    if is_sqlite(url):
        path = Path(urlsplit(url).path)
        return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*") if p.is_file())
    return subprocess.run(["pg_dump", url], check=True, capture_output=True).stdout


async def run_one(vault: Vault, task_id: str) -> Any:
    await vault.app.submit_async(vault.open_account, {"id": 1, "pin": sw.Secret(PIN)},
                                 task_id=task_id)  # fmt: skip
    await vault.app.send_event_async(task_id, "card", {"card": sw.Secret(CARD)})
    return await vault.app.result_async(task_id, timeout=30)


async def test_a_dump_of_the_store_holds_no_secret_yet_the_task_gets_them(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    keys: dict[str, str] = {}
    vault = Vault(store_url, keyring("k1", keys=keys))
    try:
        async with running(vault.app, FAST):
            result = await run_one(vault, "acct-1")
    finally:
        await vault.app.aclose()
    assert vault.seen == [(PIN, CARD), TOKEN]
    assert result["id"] == 1 and result["token"].reveal() == TOKEN
    stored = dump(store_url)
    for secret in (PIN, CARD, TOKEN):
        assert secret.encode() not in stored
    assert b'"$sealed"' in stored
    for key in keys.values():  # no key material in the store, nor in the log
        assert key.encode() not in stored
        assert key not in caplog.text
    for secret in (PIN, CARD, TOKEN):
        assert secret not in caplog.text


async def test_a_sealed_value_copied_to_another_task_does_not_open(store_url: str) -> None:
    ring = keyring("k1", keys={})
    app = sw.App("vault", store=store_url, keys=ring)

    @app.workflow(complete_within=timedelta(seconds=30))
    async def hold(ctx: sw.Context, order: Any) -> None:
        return None

    try:
        await app.submit_async(hold, {"pin": sw.Secret(PIN)}, task_id="victim")
        await app.submit_async(hold, {"pin": sw.Secret("mine")}, task_id="thief")
        sql(
            store_url,
            "UPDATE stepwarden_tasks SET input = (SELECT input FROM stepwarden_tasks WHERE "
            "task_id = 'victim') WHERE task_id = 'thief'",
        )
        victim, thief = [await app.status_async(t) for t in ("victim", "thief")]
        assert victim.input["pin"].reveal() == PIN
        with pytest.raises(sw.KeyringError, match="does not open"):
            thief.input["pin"].reveal()
    finally:
        await app.aclose()


async def test_a_store_read_with_a_wrong_keyring_or_none_is_refused(store_url: str) -> None:
    keys: dict[str, str] = {}
    vault = Vault(store_url, keyring("k1", keys=keys))
    try:
        await vault.app.submit_async(vault.open_account, {"id": 1, "pin": sw.Secret(PIN)},
                                     task_id="t")  # fmt: skip
    finally:
        await vault.app.aclose()
    wrong = Vault(store_url, keyring("k1", keys={}))  # another key under the same id
    with pytest.raises(sw.KeyringError, match="wrong key"):
        await wrong.app.store()
    await wrong.app.aclose()
    none = Vault(store_url, None)
    try:
        task = await none.app.status_async("t")
        with pytest.raises(sw.KeyringError, match="no keyring"):
            task.input["pin"].reveal()
        assert repr(task.input["pin"]) == "Secret('***')"
        with pytest.raises(sw.KeyringError, match="no keyring to open them"):
            async with running(none.app, FAST):
                pass
        # Nor does it store a secret plain in a store that seals them.
        with pytest.raises(sw.KeyringError, match="no keyring to seal this one"):
            await none.app.submit_async(none.open_account, {"id": 2, "pin": sw.Secret(PIN)},
                                        task_id="t2")  # fmt: skip
        with pytest.raises(sw.KeyringError, match="no keyring to seal this one"):
            await none.app.send_event_async("t", "card", {"card": sw.Secret(CARD)})
        assert await none.app.store() and (await (await none.app.store()).get_task("t2")) is None
    finally:
        await none.app.aclose()


async def test_reseal_moves_every_value_to_the_newest_key_and_the_old_key_can_go(
    store_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Values stored plain before a keyring was set, and values sealed under k1, are all
    sealed under k2 by `stepwarden reseal`; then, with k1 gone from the keyring, a task
    submitted under k1 that waited for its event all along still runs, and a re-submit of it
    is still known for the same."""
    keys: dict[str, str] = {}
    plain = Vault(store_url, None)
    try:
        await plain.app.submit_async(plain.open_account, {"id": 1, "pin": sw.Secret(PIN)},
                                     task_id="plain")  # fmt: skip
    finally:
        await plain.app.aclose()
    assert PIN.encode() in dump(store_url)
    old = Vault(store_url, keyring("k1", keys=keys))
    try:
        await old.app.submit_async(old.open_account, {"id": 2, "pin": sw.Secret(PIN)},
                                   task_id="old")  # fmt: skip
        await old.app.send_event_async("old", "card", {"card": sw.Secret(CARD)})
    finally:
        await old.app.aclose()
    keyring("k1", "k2", keys=keys)  # k2 made
    path = tmp_path / "keyring"
    path.write_text(f"digest d1 {keys['d1']}\nseal k1 {keys['k1']}\nseal k2 {keys['k2']}\n")
    path.chmod(0o600)
    monkeypatch.setenv("STEPWARDEN_KEYRING", str(path))
    done = await asyncio.to_thread(invoke, "--store", store_url, "reseal", "--batch", "1")
    assert done.exit_code == 0, done.output
    assert "no value is sealed under k1" in done.output, done.output
    stored = dump(store_url)
    assert PIN.encode() not in stored and CARD.encode() not in stored
    assert b'"$sealed":"k1:' not in stored and b'"$sealed":"k2:' in stored
    again = await asyncio.to_thread(invoke, "--store", store_url, "reseal")
    assert again.exit_code == 0 and "resealed 0 record(s)" in again.output, again.output
    new = Vault(store_url, keyring("k2", keys=keys))  # k1 is gone
    try:
        assert [k for k in await (await new.app.store()).sealing_keys()] == ["k2"]
        async with running(new.app, FAST):
            await new.app.send_event_async("plain", "card", {"card": sw.Secret(CARD)})
            for task_id in ("old", "plain"):
                result = await new.app.result_async(task_id, timeout=30)
                assert result["token"].reveal() == TOKEN
        # What each task's step saw, and what its workflow got back (the two tasks' in any
        # interleaving).
        assert [s for s in new.seen if isinstance(s, tuple)] == [(PIN, CARD), (PIN, CARD)]
        assert [s for s in new.seen if not isinstance(s, tuple)] == [TOKEN, TOKEN]
        store = await new.app.store()
        task = await store.get_task("old")
        assert task is not None and task.input_digest is not None
        assert task.input_digest.startswith("k.d1:")
    finally:
        await new.app.aclose()
