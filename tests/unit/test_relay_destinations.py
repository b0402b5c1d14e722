"""A reply_to that names a broker: what is accepted, what is refused (never echoing a
password), and the workers' file of credentials."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stepwarden import ConfigurationError
from stepwarden.destinations import (
    SCHEMES,
    Destination,
    Destinations,
    destination,
    is_destination,
)
from stepwarden.relay import Brokers
from stepwarden.states import FINISHED_TASK_STATES
from stepwarden.store import _sql


@pytest.mark.parametrize(
    ("reply_to", "expected"),
    [
        ("amqp://rabbit/orders", Destination("amqp", "rabbit", 5672, "orders")),
        ("amqp://rabbit:5673/a%2Fb", Destination("amqp", "rabbit", 5673, "a/b")),
        ("nats://nats:4223/shop.orders", Destination("nats", "nats", 4223, "shop.orders")),
        ("redis://[::1]/orders", Destination("redis", "::1", 6379, "orders")),
    ],
)
def test_a_broker_destination(reply_to: str, expected: Destination) -> None:
    assert is_destination(reply_to)
    assert destination(reply_to) == expected


@pytest.mark.parametrize(
    ("reply_to", "why"),
    [
        ("kafka://k/orders", "names no broker"),
        ("AMQP://rabbit/orders", "names no broker"),
        ("amqp://me:pa55word@rabbit/orders", "carries credentials"),
        ("redis://:pa55word@redis/orders", "carries credentials"),
        ("amqp://rabbit/", "names no queue"),
        ("amqp:///orders", "names no host"),
        ("nats://nats/a.*", "NATS subject"),
        ("nats://nats/a..b", "NATS subject"),
        ("redis://redis:99999/s", "bad port"),
        ("redis://redis/s?db=1", "no query"),
    ],
)
def test_a_bad_destination_is_refused_without_its_password(reply_to: str, why: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(why)) as refused:
        destination(reply_to)
    assert "pa55word" not in str(refused.value)


def test_a_plain_channel_is_not_a_destination() -> None:
    assert not is_destination("orders")


def test_the_migration_names_the_same_schemes() -> None:
    [pg] = [m.sql for m in _sql.migrations("postgres") if m.name == "0017_relay.sql"]
    [lite] = [m.sql for m in _sql.migrations("sqlite") if m.name == "0017_relay.sql"]
    assert f"^({'|'.join(SCHEMES)})://" in pg
    for scheme in SCHEMES:
        assert f"NEW.channel LIKE '{scheme}://%'" in lite


def test_the_credentials_file(tmp_path: Path) -> None:
    path = tmp_path / "brokers.json"
    path.write_text(
        json.dumps(
            {
                "amqp://rabbit": {"username": "shop", "password": "pw-1", "vhost": "/shop"},
                "nats://nats:4222": {"token": "tk-2"},
                "redis://redis:6380/": {"password": "pw-3", "db": 2, "tls": True},
            }
        )
    )
    path.chmod(0o600)
    brokers = Brokers.from_file(str(path))
    amqp = brokers.of(destination("amqp://rabbit:5672/orders"))
    assert (amqp.username, amqp.vhost) == ("shop", "/shop")
    assert amqp.password is not None and amqp.password.reveal() == "pw-1"
    assert brokers.of(destination("redis://redis:6380/s")).db == 2
    assert brokers.of(destination("redis://redis/s")).password is None  # another port
    assert sorted(brokers.secrets()) == ["pw-1", "pw-3", "tk-2"]
    assert not any(s in repr(brokers) for s in ("pw-1", "pw-3", "tk-2"))
    assert Brokers.from_env({}).access == {}
    assert Brokers.from_env({"STEPWARDEN_BROKERS": str(path)}) == brokers


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ({"amqp://u:pw-9@rabbit": {}}, "not a broker"),
        ({"http://rabbit": {}}, "not a broker"),
        ({"amqp://rabbit": {"pasword": "pw-9"}}, "unknown: ['pasword']"),
        ({"amqp://rabbit": {"password": 9}}, "a bad field"),
        ([], "a JSON object"),
    ],
)
def test_a_bad_credentials_file_is_refused_without_its_secrets(
    tmp_path: Path, content: object, why: str
) -> None:
    path = tmp_path / "brokers.json"
    path.write_text(json.dumps(content))
    path.chmod(0o600)
    with pytest.raises(ConfigurationError, match=re.escape(why)) as refused:
        Brokers.from_file(str(path))
    assert "pw-9" not in str(refused.value)


def test_a_credentials_file_others_may_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "brokers.json"
    path.write_text("{}")
    path.chmod(0o640)
    with pytest.raises(ConfigurationError, match="chmod 600"):
        Brokers.from_file(str(path))


LIST = """
# NAME    BROKER                   NAMES
shop      amqp://Rabbit            orders,replies.*
events    nats://nats:4223         shop.events.*
anything  redis://[::1]:6380       *
"""


@pytest.mark.parametrize(
    ("reply_to", "entry"),
    [
        ("amqp://rabbit:5672/orders", "shop"),
        ("amqp://RABBIT/orders", "shop"),  # a host's name in any case
        ("amqp://rabbit/replies.a.b", "shop"),
        ("amqp://rabbit/orders2", None),  # a name is the whole name
        ("amqp://rabbit/replies", None),  # replies.* is the names after "replies."
        ("amqp://rabbit:5673/orders", None),  # another port: another broker
        ("amqp://rabbit.evil/orders", None),  # the entry's broker is not a prefix of URLs
        ("amqp://rabbit.evil:5672/orders", None),
        ("redis://rabbit/orders", None),
        ("nats://nats:4223/shop.events.paid", "events"),
        ("nats://nats/shop.events.paid", None),  # 4222
        ("redis://[::1]:6380/anything-at-all", "anything"),
        ("redis://127.0.0.1:6380/x", None),
    ],
)
def test_a_destination_is_listed_by_its_parsed_parts(reply_to: str, entry: str | None) -> None:
    listed = Destinations.parse(LIST)
    found = listed.find(destination(reply_to))
    assert (found.name if found else None) == entry
    assert listed.names() == {"shop", "events", "anything"}
    if entry is None:
        with pytest.raises(ConfigurationError, match="is not listed in the destinations file"):
            listed.check(reply_to)
    else:
        assert listed.check(reply_to) == destination(reply_to)
        assert listed.find(destination(reply_to), among=["other"]) is None
        with pytest.raises(ConfigurationError, match="not a destination this client may name"):
            listed.check(reply_to, among=["other"])


def test_without_a_list_no_destination_is_listed(tmp_path: Path) -> None:
    none = Destinations.from_env({})
    assert none.entries == () and none.source is None
    with pytest.raises(ConfigurationError, match="no broker destination is allowed"):
        none.check("amqp://rabbit/orders")
    path = tmp_path / "destinations"
    path.write_text(LIST)
    listed = Destinations.from_env({"STEPWARDEN_DESTINATIONS": str(path)})
    assert listed == Destinations.from_file(path)
    assert listed.source == str(path)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("shop amqp://rabbit", "line 1: expected NAME BROKER NAMES"),
        ("shop amqp://me:pa55word@rabbit orders", "line 1: 'amqp://rabbit' is not a broker"),
        ("shop amqp://rabbit/orders orders", "line 1: 'amqp://rabbit' is not a broker"),
        ("shop kafka://k orders", "line 1: 'kafka://k' is not a broker"),
        ("shop amqp://rabbit:99999 orders", "line 1: 'amqp://rabbit' is not a broker"),
        ("# x\nshop amqp://rabbit a\nshop amqp://rabbit b", "line 3: the entry 'shop' is named"),
        ("shop amqp://rabbit a*b", "line 1: 'a*b': a name, or a start of names followed by"),
        ("shop amqp://rabbit ,", "line 1: give the entry at least one name"),
        ("sh/op amqp://rabbit a", "line 1: an entry's name is 1 to 64 letters"),
    ],
)
def test_a_wrong_destinations_file_is_refused_naming_the_line(text: str, fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=r"^the destinations file, ") as refused:
        Destinations.parse(text)
    assert fragment in str(refused.value)
    assert "pa55word" not in str(refused.value)


def test_a_destinations_file_others_may_write_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "destinations"
    path.write_text(LIST)
    path.chmod(0o644)  # no credentials in it: others may read it
    assert len(Destinations.from_file(path).entries) == 3
    path.chmod(0o664)
    with pytest.raises(ConfigurationError, match=r"may be written by others .* \(mode 664\)"):
        Destinations.from_file(path)


def test_a_clients_unfinished_tasks_are_counted_in_the_states_of_the_index() -> None:
    """The count of a client's unfinished tasks names the finished states as its partial
    index does (migration 0019), so that it is read through it."""
    states = "', '".join(sorted(FINISHED_TASK_STATES))
    for dialect in ("sqlite", "postgres"):
        [index] = [m.sql for m in _sql.migrations(dialect) if m.name == "0019_clients.sql"]
        query = _sql.queries(dialect)["client_unfinished"]
        for text in (index, query):
            found = re.search(r"process_state NOT IN \(([^)]*)\)", text)
            assert found is not None
            listed = sorted(s.strip().strip("'") for s in found.group(1).split(","))
            assert "', '".join(listed) == states, (dialect, text)
