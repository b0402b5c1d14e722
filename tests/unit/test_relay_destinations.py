"""A reply_to that names a broker: what is accepted, what is refused (never echoing a
password), and the workers' file of credentials."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stepwarden import ConfigurationError
from stepwarden.destinations import SCHEMES, Destination, destination, is_destination
from stepwarden.relay import Brokers
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
