"""Where a task lives when the store is several PostgreSQL databases (shards): the placement
rule, the one home of it.

A task's id falls in one of `SLOTS` fixed slots (`slot_of`: a hash of the id, the same in
every process and every release). A small map, stored in every shard, says which shard owns
each slot; it has generations. Adding a shard writes a new generation that gives the new
shard an even share of the slots, taken from the shards that had more than theirs, and
moves nothing: a task stays where it was created, so a task of a slot that changed owner is
found at the slot's earlier owners (`ShardMap.owners`, newest first). A submit first looks
for the id there, so that it stays idempotent across generations, then creates the task at
the slot's newest owner, in a transaction that checks the shard still holds the generation
the submitter read (a submitter with a stale map reads it again and retries). A child task
lives on its parent's shard, whatever its slot.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import ConfigurationError

SLOTS = 1024
"""The fixed number of slots. Never changed: a task's slot is computed from its id alone."""

SHARD_NAME = re.compile(r"^s[1-9][0-9]{0,5}$")
"""Shard names, given in order: s1, s2, ..."""


def slot_of(task_id: str) -> int:
    """The slot of a task id: the first 8 bytes of its BLAKE2b digest, modulo SLOTS."""
    digest = hashlib.blake2b(task_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % SLOTS


@dataclass(frozen=True, slots=True)
class Generation:
    """One generation of the map: the shards it names, and the owner of each slot (an index
    into `shards`)."""

    number: int
    shards: tuple[str, ...]
    slots: tuple[int, ...]

    def owner(self, slot: int) -> str:
        return self.shards[self.slots[slot]]

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(self.shards, 0)
        for index in self.slots:
            counts[self.shards[index]] += 1
        return counts

    def encoded(self) -> tuple[str, str]:
        """The shards and slots as stored (JSON arrays)."""
        return json.dumps(list(self.shards)), json.dumps(list(self.slots))

    @classmethod
    def decoded(cls, number: int, shards: str, slots: str) -> Generation:
        names, owners = json.loads(shards), json.loads(slots)
        if (
            not isinstance(names, list)
            or not all(isinstance(n, str) for n in names)
            or not isinstance(owners, list)
            or len(owners) != SLOTS
            or not all(isinstance(i, int) and 0 <= i < len(names) for i in owners)
        ):
            raise ConfigurationError(f"the stored shard map's generation {number} is malformed")
        return cls(number, tuple(names), tuple(owners))


@dataclass(frozen=True, slots=True)
class ShardMap:
    """Every generation of the map, oldest first."""

    generations: tuple[Generation, ...]

    @classmethod
    def first(cls, names: Sequence[str]) -> ShardMap:
        """Generation 1: the slots dealt evenly over `names`, in turn."""
        if not names or len(set(names)) != len(names):
            raise ConfigurationError(f"a shard map needs distinct shard names, not {names!r}")
        return cls((Generation(1, tuple(names), tuple(i % len(names) for i in range(SLOTS))),))

    @property
    def current(self) -> Generation:
        return self.generations[-1]

    @property
    def generation(self) -> int:
        return self.current.number

    @property
    def shards(self) -> tuple[str, ...]:
        return self.current.shards

    def home(self, task_id: str) -> str:
        """The shard where a new task with this id is created."""
        return self.current.owner(slot_of(task_id))

    def owners(self, task_id: str) -> list[str]:
        """The shards that owned this id's slot, newest first, each once: where a task with
        this id may have been created (a child excepted: it lives on its parent's shard)."""
        slot = slot_of(task_id)
        found: list[str] = []
        for gen in reversed(self.generations):
            owner = gen.owner(slot)
            if owner not in found:
                found.append(owner)
        return found

    def next_name(self) -> str:
        """The name the next shard added gets."""
        return f"s{max(int(n[1:]) for n in self.shards) + 1}"

    def with_shard(self, name: str) -> ShardMap:
        """A new generation with shard `name` added: it takes an even share of the slots
        (SLOTS // shards, one more for the first SLOTS % shards in order), each taken from a
        shard that holds more than its share, lowest slots first; every other slot keeps its
        owner."""
        if name in self.shards:
            raise ConfigurationError(f"shard {name!r} is in the map already")
        names = (*self.shards, name)
        share = {n: SLOTS // len(names) + (i < SLOTS % len(names)) for i, n in enumerate(names)}
        held = self.current.counts()
        held[name] = 0
        owners = list(self.current.slots)
        new = len(names) - 1
        for slot, index in enumerate(owners):
            if held[name] >= share[name]:
                break
            owner = names[index]
            if held[owner] > share[owner]:
                owners[slot] = new
                held[owner] -= 1
                held[name] += 1
        gen = Generation(self.generation + 1, names, tuple(owners))
        return ShardMap((*self.generations, gen))
