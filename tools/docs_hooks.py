"""mkdocs hooks: the reference pages generated from the code at each build.

- `reference/configuration.md`: every environment variable, from the click options of
  `stepwarden.cli:cli` that read one (their `envvar`), with the options and commands that
  read it and the option's help.
- `reference/http-api.md`: the dashboard's JSON API and the application API (/api/v1), from
  the OpenAPI document of `stepwarden.dashboard.create_app(...)` (its paths, parameters,
  bodies, answers and models).

Nothing is kept by hand: a new option or route shows on the next build.
"""

from __future__ import annotations

import copy
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

CONFIGURATION = "reference/configuration.md"
HTTP_API = "reference/http-api.md"


def on_startup(command: str, dirty: bool) -> None:
    _unset_defaults_shown_as_none()


def _unset_defaults_shown_as_none() -> None:
    """mkdocs-click writes an option's default as it is: with click 8.2 and later an option
    given no default holds click's `UNSET` sentinel, which would show as `Sentinel.UNSET` in
    the Default column. Such an option is shown as one whose default is None (or
    "_required")."""
    from mkdocs_click import _docs

    row = _docs._format_table_option_row
    if getattr(row, "unset_as_none", False):
        return

    def shown(option: click.Option) -> str:
        if option.default is not None and type(option.default).__name__ == "Sentinel":
            option = copy.copy(option)
            option.default = None
        return row(option)

    shown.unset_as_none = True  # type: ignore[attr-defined]
    _docs._format_table_option_row = shown


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for path, text in ((CONFIGURATION, configuration_page()), (HTTP_API, http_api_page())):
        files.append(File.generated(config, path, content=text))
    return files


# --- configuration and environment variables ------------------------------------------------


def _commands(
    command: click.Command, path: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            yield from _commands(sub, (*path, name))


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def configuration_page() -> str:
    from stepwarden.cli import cli

    rows: dict[str, dict[str, Any]] = {}
    for path, command in _commands(cli, ("stepwarden",)):
        for param in command.params:
            if not isinstance(param, click.Option) or not param.envvar:
                continue
            names = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar)
            for name in names:
                row = rows.setdefault(
                    name, {"options": [], "commands": [], "help": param.help or ""}
                )
                option = max(param.opts, key=len)
                if option not in row["options"]:
                    row["options"].append(option)
                row["commands"].append(" ".join(path))
    lines = [
        "# Configuration and environment variables",
        "",
        "Generated from the command line's options at each build of these pages: every",
        "option below also reads the environment variable beside it (the option, when given,",
        "wins). The command line's global options (`--app`, `--store`, `--log-level`,",
        "`--log-format`) go before the command or after it (`stepwarden --store URL tasks` or",
        "`stepwarden tasks --store URL`). [The command line](cli.md) has each command's",
        "options in full.",
        "",
        "| variable | option | commands | what it sets |",
        "|---|---|---|---|",
    ]
    for name in sorted(rows):
        row = rows[name]
        commands = ", ".join(f"`{c}`" for c in row["commands"])
        options = ", ".join(f"`{o}`" for o in row["options"])
        lines.append(f"| `{name}` | {options} | {commands} | {_cell(row['help'])} |")
    from stepwarden import relay, sealing

    lines += [
        "",
        "Read by the workers, beside their options:",
        "",
        "| variable | what it sets |",
        "|---|---|",
        f"| `{relay.ENV}` | the JSON file of the brokers' credentials, for status messages "
        "relayed to the application's own broker (`reply_to` `amqp://`, `nats://`, "
        "`redis://`): only its owner may read it ([status messages on a broker]"
        "(../howto/observing.md#status-messages)) |",
        "",
        "Read by every process that seals or opens secrets (the App, `stepwarden worker`, "
        "`stepwarden dashboard`, `stepwarden reseal`; [secrets sealed at rest]"
        "(../howto/secrets.md)), one or the other:",
        "",
        "| variable | what it sets |",
        "|---|---|",
        f"| `{sealing.KEYRING_ENV}` | the keyring's file (`stepwarden keys new FILE`): only "
        "its owner may read it |",
        f"| `{sealing.KEYS_ENV}` | the keyring's text itself: `seal ID KEY` and `digest ID "
        "KEY` entries, separated by newlines or `;` |",
        "",
        "From Python, an application is configured by its arguments:",
        "[`App`](api.md#stepwarden.App), [`WorkerOptions`](api.md#stepwarden.WorkerOptions),",
        "[`Retry`](api.md#stepwarden.Retry), [`Breaker`](api.md#stepwarden.Breaker),",
        "[`Limit`](api.md#stepwarden.Limit).",
        "",
        "The store URL (`--store`, `STEPWARDEN_STORE`, `App(store=...)`): `sqlite:///path.db`",
        "(`?synchronous=normal` trades durability on power loss for speed; `?wake=off`: no",
        "wake-ups by datagram between the processes on the file, polling only) or",
        "`postgresql://...` (libpq's parameters; `?pooler=transaction` behind PgBouncer in",
        "transaction mode), or several `postgresql://...` URLs separated by spaces: a store",
        "of shards, each task on one of them. [Stores](../concepts/stores.md) says what each",
        "one does.",
        "",
        "The test suite reads `STEPWARDEN_TEST_POSTGRES_URL`, `STEPWARDEN_TEST_POSTGRES_LOG`",
        "and `STEPWARDEN_TEST_CHROMIUM` (see the README's first section).",
        "",
    ]
    return "\n".join(lines)


# --- the HTTP API ---------------------------------------------------------------------------


def _anchor(name: str) -> str:
    return "schema-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return f"[{name}](#{_anchor(name)})"
    if "anyOf" in schema or "oneOf" in schema:
        return " or ".join(_type(s) for s in schema.get("anyOf", schema.get("oneOf", [])))
    if "allOf" in schema:
        return " and ".join(_type(s) for s in schema["allOf"])
    kind = schema.get("type")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if kind == "object" and "additionalProperties" in schema:
        extra = schema["additionalProperties"]
        return f"object of {_type(extra) if isinstance(extra, dict) else 'any'}"
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    if kind is None:
        return "any"
    fmt = schema.get("format")
    return f"{kind} ({fmt})" if fmt else str(kind)


def _media(content: dict[str, Any]) -> str:
    parts = []
    for media, body in content.items():
        schema = body.get("schema", {})
        parts.append(f"`{media}`" + (f": {_type(schema)}" if schema else ""))
    return "; ".join(parts)


def http_api_page() -> str:
    import stepwarden
    from stepwarden.dashboard import create_app

    with tempfile.TemporaryDirectory() as folder:
        # The App is only declared: its store is never opened to make the document.
        app = stepwarden.App("docs", store=f"sqlite:///{Path(folder) / 'docs.db'}")
        document = create_app(app, token="d" * 32).openapi()
    info = document.get("info", {})
    lines = [
        "# HTTP API",
        "",
        f"The dashboard's JSON API ({info.get('title', '')} {info.get('version', '')}),",
        "generated at each build of these pages from its OpenAPI document, the one a",
        "running dashboard serves at `/openapi.json`. Reads need nothing on loopback;",
        "actions (POST) need the API token as `Authorization: Bearer TOKEN`, or a session",
        "and its CSRF token (see [the dashboard](../howto/dashboard.md)). An API mounted",
        "with `create_app(app, auth=DEPENDENCY)` has the same paths under its mount. A",
        'request the models refuse is answered 400 with `{"error": ...}`.',
        "",
        "The application API, the paths under `/api/v1` (its own document:",
        "`/api/v1/openapi.json`), needs a client's token with each route's scope (the",
        "operation's `client` security requirement) and answers an invalid request 422: see",
        "[calling from other services](../howto/http-api.md). Its submit's `workflow` is one",
        "of those the served App declares (none here: the page is made without one).",
        "",
    ]
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            lines += [f"## `{method.upper()} {path}`", ""]
            if op.get("summary"):
                lines += [op["summary"], ""]
            if op.get("description"):
                lines += [op["description"].strip(), ""]
            params = op.get("parameters", [])
            if params:
                lines += ["| parameter | in | type | required | what |", "|---|---|---|---|---|"]
                for p in params:
                    schema = p.get("schema", {})
                    what = _cell(p.get("description", schema.get("description", "")))
                    lines.append(
                        f"| `{p['name']}` | {p['in']} | {_type(schema)} | "
                        f"{'yes' if p.get('required') else 'no'} | {what} |"
                    )
                lines.append("")
            body = op.get("requestBody")
            if body:
                lines += [f"Body: {_media(body.get('content', {}))}", ""]
            lines += ["| answer | what | body |", "|---|---|---|"]
            for code, answer in op.get("responses", {}).items():
                lines.append(
                    f"| {code} | {_cell(answer.get('description', ''))} | "
                    f"{_media(answer.get('content', {}))} |"
                )
            lines.append("")
    schemas = document.get("components", {}).get("schemas", {})
    if schemas:
        lines += ["## Models", ""]
    for name, schema in sorted(schemas.items()):
        lines += [f"### {name} {{#{_anchor(name)}}}", ""]
        if schema.get("description"):
            lines += [_cell(schema["description"]), ""]
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        if props:
            lines += ["| field | type | required | what |", "|---|---|---|---|"]
            for field, sub in props.items():
                lines.append(
                    f"| `{field}` | {_type(sub)} | {'yes' if field in required else 'no'} | "
                    f"{_cell(sub.get('description', ''))} |"
                )
            lines.append("")
        elif "enum" in schema:
            lines += [f"One of {_type(schema)}.", ""]
    return "\n".join(lines)
