"""`stepwarden reseal`: every sealed secret of the store moved to the keyring's newest key, and
every plain one sealed, a batch at a time, while workers run.

Each round reads one place's next rows that may hold a secret (their JSON text holds
`"$secret"` or `"$sealed"`), in key order after where the last round stopped, seals their
secrets anew (`_json.dumps` seals what is plain, and what was sealed under an older key, for
the record that holds it), and writes each payload back only where it is still the text read:
a write since (a worker's) wins, and the next pass looks at it again. A task's input also gets
its keyed digest (`sealing.input_digest`), which a re-submit is compared by. A round is one
transaction; stopped anywhere, the next run starts over, and finds done what is done.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import _json
from ..errors import KeyringError, PayloadError
from ..sealing import DIGEST_KEYED, Binding, Keyring, input_digest
from . import _rows
from ._flow import Flow, Query, Row, Wakeups

PLACES = ("tasks", "steps", "inbox", "waits", "schedules", "outbox")
"""Where payloads are kept, in the order a pass goes through them."""


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a pass through one place has got to: after the row of this key."""

    place: str
    after: str = ""
    after_seq: int = 0
    after_id: int = 0


@dataclass(slots=True)
class Round:
    """What one round did: payloads sealed anew, those that would not open (with the first
    errors), and where the next round starts (None: the place is done)."""

    resealed: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    next: Cursor | None = None


def _anew(text: str | None, at: Binding | None, keys: Keyring, done: Round) -> str | None:
    """`text` with its secrets sealed anew for `at`, or None when nothing changes (or it does
    not open: counted as failed)."""
    if text is None or not _json.holds_secret(text):
        return None
    try:
        if at is None:
            raise KeyringError("a secret in a payload whose record is not known")
        fresh = _json.dumps(_json.loads(text, at=at, keys=keys), seal=_json.Seal(keys, at))
    except (KeyringError, PayloadError) as exc:
        done.failed += 1
        if len(done.errors) < 5:
            done.errors.append(str(exc))
        return None
    return None if fresh == text else fresh


def _digest(row: Row, keys: Keyring, done: Round) -> str | None:
    """A task's keyed digest, where its stored one is not keyed by the current digest key."""
    if str(row["input_digest"] or "").startswith(f"{DIGEST_KEYED}.{keys.digest_current}:"):
        return None
    try:
        value = _json.loads(row["input"], at=Binding.input(row["task_id"]), keys=keys)
        return input_digest(_json.plain(value), keys)
    except (KeyringError, PayloadError) as exc:
        done.failed += 1
        if len(done.errors) < 5:
            done.errors.append(str(exc))
        return None


def reseal(cursor: Cursor, limit: int, keys: Keyring, wake: Wakeups) -> Flow[Round]:
    """One round of `cursor`'s place: at most `limit` rows looked at, in one transaction."""
    place = cursor.place
    done = Round()
    if place == "tasks":
        [rows] = yield [Query("reseal_tasks", {"after": cursor.after, "limit": limit})]
        each = _tasks(rows, keys, done)
        if each:
            yield [Query("reseal_task", each=each)]
    elif place == "steps":
        after = {"after": cursor.after, "after_seq": cursor.after_seq, "limit": limit}
        [rows] = yield [Query("reseal_steps", after)]
        each = _steps(rows, keys, done)
        if each:
            yield [Query("reseal_step", each=each)]
    elif place == "inbox":
        [rows] = yield [Query("reseal_inbox_rows", {"after_id": cursor.after_id, "limit": limit})]
        each = [
            {"id": r["id"], "old": r["doc"], "doc": new}
            for r, new in _docs(
                rows, lambda r: Binding.event(r["task_id"], r["event_id"]), keys, done
            )
        ]
        if each:
            yield [Query("reseal_inbox", each=each)]
    elif place == "waits":
        after = {"after": cursor.after, "after_seq": cursor.after_seq, "limit": limit}
        [rows] = yield [Query("reseal_wait_rows", after)]
        each = [
            {"task_id": r["task_id"], "seq": r["seq"], "old": r["doc"], "doc": new}
            for r, new in _docs(rows, _rows.wait_binding, keys, done)
        ]
        if each:
            yield [Query("reseal_waits", each=each)]
    elif place == "schedules":
        [rows] = yield [Query("reseal_schedule_rows", {"after": cursor.after, "limit": limit})]
        each = [
            {"name": r["name"], "old": r["doc"], "doc": new}
            for r, new in _docs(rows, lambda r: Binding.schedule(r["name"]), keys, done)
        ]
        if each:
            yield [Query("reseal_schedules", each=each)]
    else:
        [rows] = yield [Query("reseal_outbox_rows", {"after_id": cursor.after_id, "limit": limit})]
        each = [
            {"id": r["id"], "old": r["doc"], "doc": new}
            for r, new in _docs(rows, _outbox_binding, keys, done)
        ]
        if each:
            yield [Query("reseal_outbox", each=each)]
    done.resealed = len(each)
    if len(rows) == limit:
        done.next = _after(cursor, rows[-1])
    return done


def _outbox_binding(row: Row) -> Binding | None:
    """A status message's detail copies its task's result (`_rows.message`)."""
    return None if row["task_id"] is None else Binding.result(row["task_id"])


def _after(cursor: Cursor, row: Row) -> Cursor:
    if cursor.place in ("inbox", "outbox"):
        return Cursor(cursor.place, after_id=int(row["id"]))
    if cursor.place == "schedules":
        return Cursor(cursor.place, after=row["name"])
    return Cursor(cursor.place, after=row["task_id"], after_seq=int(row.get("seq") or 0))


def _tasks(rows: Sequence[Row], keys: Keyring, done: Round) -> list[dict[str, Any]]:
    each = []
    for r in rows:
        task_id = r["task_id"]
        new_input = _anew(r["input"], Binding.input(task_id), keys, done)
        new_result = _anew(r["result"], Binding.result(task_id), keys, done)
        digest = _digest(r, keys, done)
        if new_input is None and new_result is None and digest is None:
            continue
        each.append(
            {
                "task_id": task_id,
                "old_input": r["input"],
                "input": r["input"] if new_input is None else new_input,
                "old_result": r["result"],
                "result": r["result"] if new_result is None else new_result,
                "input_digest": r["input_digest"] if digest is None else digest,
            }
        )
    return each


def _steps(rows: Sequence[Row], keys: Keyring, done: Round) -> list[dict[str, Any]]:
    each = []
    for r in rows:
        here = Binding.step(r["task_id"], int(r["seq"]))
        new = {c: _anew(r[c], here, keys, done)
               for c in ("input", "result", "compensation_input", "heartbeat")}  # fmt: skip
        if all(v is None for v in new.values()):
            continue
        each.append(
            {
                "task_id": r["task_id"],
                "seq": int(r["seq"]),
                "old_input": r["input"],
                "input": new["input"] or r["input"],
                "old_result": r["result"],
                "result": new["result"] or r["result"],
                "old_comp": r["compensation_input"],
                "comp": new["compensation_input"] or r["compensation_input"],
                "old_beat": r["heartbeat"],
                "beat": new["heartbeat"] or r["heartbeat"],
            }
        )
    return each


def _docs(
    rows: Sequence[Row], binding: Callable[[Row], Binding | None], keys: Keyring, done: Round
) -> list[tuple[Row, str]]:
    """The rows whose `doc` changes, with their new text."""
    found = []
    for r in rows:
        new = _anew(r["doc"], binding(r), keys, done)
        if new is not None:
            found.append((r, new))
    return found
