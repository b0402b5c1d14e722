"""`stepwarden worker` and `WorkerOptions` default alike: an option left out of the command
line is the Python API's default."""

from __future__ import annotations

import dataclasses

import click

from stepwarden.cli import cli
from stepwarden.retry import Backoff
from stepwarden.worker import WorkerOptions


def test_each_worker_option_defaults_to_the_python_apis_default() -> None:
    command = cli.commands["worker"]
    options = {p.name: p for p in command.params if isinstance(p, click.Option)}
    fields = {f.name: f for f in dataclasses.fields(WorkerOptions)}
    shared = sorted(set(options) & set(fields))
    assert {"concurrency", "agent_concurrency", "drain_timeout", "supervisor_interval"} <= set(
        shared
    )
    for name in shared:
        field = fields[name]
        if field.default is dataclasses.MISSING or name == "roles" or options[name].multiple:
            continue  # a factory's; a list on the command line (roles, each webhook given)
        assert options[name].default == field.default, name
    backoff = Backoff()
    assert options["backoff_initial"].default == backoff.initial
    assert options["backoff_max"].default == backoff.maximum
