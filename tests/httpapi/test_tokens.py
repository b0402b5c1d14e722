"""The clients' tokens: `stepwarden api-token` makes one and its line for the tokens file
(printed, or appended to the file), the file keeps only each token's SHA-256 digest, and a
file that is wrong in any way is refused naming the line at fault."""

from __future__ import annotations

import hashlib
import re
import stat
from pathlib import Path

import httpx
import pytest

from stepwarden import ConfigurationError, _tokens
from tests.cli.helpers import assert_ok, assert_refused, invoke

from .conftest import TIMEOUT, Tokens, serving, until


def test_api_token_prints_a_new_token_once_and_the_line_that_knows_it() -> None:
    out = assert_ok(invoke("api-token", "billing", "--scope", "submit", "--scope", "read"))
    intro, token, said, line = out.splitlines()
    assert intro == "the token of billing (shown once; give it to the client):"
    assert said == "its line for the tokens file (--api-tokens FILE):"
    assert token.startswith("sw_") and len(token) >= 40
    name, scopes, digest = line.split()
    assert (name, scopes) == ("billing", "read,submit")
    assert digest == hashlib.sha256(token.encode()).hexdigest()  # the digest, never the token
    assert token not in line
    clients = _tokens.parse(line)
    found = clients.find(token)
    assert found is not None and found.name == "billing"
    assert found.scopes == {"submit", "read"}
    assert clients.find(token + "x") is None and clients.find("") is None
    # Each run makes another token.
    other = assert_ok(invoke("api-token", "billing", "--scope", "read")).splitlines()[1]
    assert other != token
    # The scopes may come from the environment, space-separated; agent:NAME is reserved.
    out = assert_ok(
        invoke("api-token", "relay", env={"STEPWARDEN_API_TOKEN_SCOPE": "events agent:desk"})
    )
    assert out.splitlines()[3].split()[1] == "agent:desk,events"


def test_api_token_appends_the_line_to_the_tokens_file(tmp_path: Path) -> None:
    path = tmp_path / "api-tokens"
    out = assert_ok(invoke("api-token", "billing", "--scope", "submit", "--append", str(path)))
    token = out.splitlines()[1]
    said = out.splitlines()[2]
    assert said == (
        f"its line is added to {path}: a dashboard serving it takes it up within a second"
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert_ok(invoke("api-token", "reports", "--scope", "read", "--append", str(path)))
    clients = _tokens.read(path)
    assert [c.name for c in clients.clients] == ["billing", "reports"]
    assert clients.find(token) == clients.clients[0]
    before = path.read_text()
    assert_refused(
        invoke("api-token", "billing", "--scope", "read", "--append", str(path)),
        "the client 'billing' is named twice",
    )
    assert path.read_text() == before  # nothing added
    path.chmod(0o662)
    assert_refused(
        invoke("api-token", "other", "--scope", "read", "--append", str(path)),
        "may be written by others than its owner",
    )


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["billing", "--scope", "ship"], "unknown scope 'ship' (known: submit, read, events"),
        (["billing", "--scope", "agent:"], "unknown scope 'agent:'"),
        (["bill ing", "--scope", "read"], "a client's name is 1 to 64 letters"),
        (["-x", "--scope", "read"], "No such option"),
        (["billing"], "Missing option '--scope'"),
    ],
)
def test_api_token_refuses_a_bad_name_or_scope(args: list[str], fragment: str) -> None:
    assert_refused(invoke("api-token", *args), fragment, exit_code=2)


DIGEST = "ab" * 32


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("billing submit", "line 1: expected NAME SCOPES SHA256"),
        (f"# clients\n\nbilling submit,cancel,ship {DIGEST}", "line 3: unknown scope 'ship'"),
        (f"billing , {DIGEST}", "line 1: give a client at least one scope"),
        ("billing submit " + "AB" * 32, "line 1: the token's SHA-256 digest is 64 lowercase hex"),
        ("billing submit sw_the-token-itself", "line 1: the token's SHA-256 digest"),
        (f"billing submit {DIGEST}\nbilling read {'cd' * 32}", "line 2: the client 'billing'"),
        (f"billing submit {DIGEST}\nother read {DIGEST}", "line 2: this token's digest is"),
        (f"bil/ling submit {DIGEST}", "line 1: a client's name"),
    ],
)
def test_a_wrong_tokens_file_is_refused_naming_the_line(text: str, fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=r"^the tokens file, ") as refused:
        _tokens.parse(text)
    assert fragment in str(refused.value)


def test_a_tokens_file_others_may_write_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "api-tokens"
    path.write_text(f"billing submit {DIGEST}\n")
    path.chmod(0o644)  # digests, not tokens: others may read it
    assert [c.name for c in _tokens.read(path).clients] == ["billing"]
    path.chmod(0o664)
    with pytest.raises(ConfigurationError, match=r"written by others than its owner \(mode 664\)"):
        _tokens.read(path)


OTHER = "cd" * 32


def test_a_line_takes_settings_and_the_defaults_line_sets_them_for_every_client() -> None:
    text = (
        "# NAME SCOPES SHA256 SETTINGS\n"
        f"old submit {DIGEST}\n"
        f"own submit,read {OTHER} submit_rate=0.5 priority=-2..3 channels=orders,{{client}}.*\n"
        "defaults submit_rate=5 unfinished=100\n"
    )
    old, own = _tokens.parse(text).clients
    assert old.setting(_tokens.SUBMIT_RATE) == 5.0  # the defaults line's
    assert own.setting(_tokens.SUBMIT_RATE) == 0.5  # its own
    assert own.setting(_tokens.UNFINISHED) == old.setting(_tokens.UNFINISHED) == 100
    assert old.setting(_tokens.INPUT_BYTES) == _tokens.INPUT_BYTES.default == 256 * 1024
    assert own.setting(_tokens.PRIORITY) == (-2, 3)
    assert old.setting(_tokens.PRIORITY) == (-10, 10)
    # Channels: by default those named after the client; its own setting otherwise.
    assert [old.may_name_channel(c) for c in ("old", "old.x", "orders", "older")] == [
        True,
        True,
        False,
        False,
    ]
    assert [own.may_name_channel(c) for c in ("orders", "own.x", "own", "old.x")] == [
        True,
        True,
        False,
        False,
    ]
    assert own.destination_entries() == () and old.destination_entries() == ()
    # Its line holds its own settings, and reads back the same.
    assert own.line() == (
        f"own read,submit {OTHER} submit_rate=0.5 priority=-2..3 channels=orders,{{client}}.*"
    )
    [again] = _tokens.parse(own.line()).clients
    assert again.own == own.own
    # A line of three fields, as before settings were: every setting its built-in default.
    [plain] = _tokens.parse(f"plain read {DIGEST}").clients
    assert all(plain.setting(s) == s.default for s in _tokens.SETTINGS.values())
    # A client's entries of the destinations file; * for every one.
    [shop] = _tokens.parse(f"shop submit {DIGEST} destinations=*").clients
    assert shop.destination_entries() is None


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (f"b submit {DIGEST} submit_rate=fast", "line 1: the setting submit_rate: expected a"),
        (f"b submit {DIGEST} rate=5", "line 1: unknown setting 'rate' (known: submit_rate, "),
        (f"b submit {DIGEST} priority=5..1", "line 1: the setting priority: expected LOW..HIGH"),
        (f"b submit {DIGEST} polls=-1", "line 1: the setting polls: expected a whole number"),
        (f"b submit {DIGEST} polls=1 polls=2", "line 1: the setting polls is given twice"),
        (f"b submit {DIGEST} sw_not-a-setting", "line 1: setting 1 is not SETTING=VALUE"),
        (f"b submit {DIGEST} channels=a*b", "line 1: the setting channels: expected channel"),
        (f"b submit {DIGEST} destinations=a/b", "line 1: the setting destinations: expected"),
        ("defaults polls=1\n\ndefaults streams=1", "line 3: a second defaults line (line 1"),
        ("defaults ttl=1.5", "line 1: the setting ttl: expected a whole number"),
        (f"defaults submit {DIGEST}", "line 1: 'defaults' names the line of every client's"),
        (f"b submit=1 {DIGEST}", "line 1: expected NAME SCOPES SHA256 (scopes separated"),
    ],
)
def test_a_wrong_setting_is_refused_naming_the_line_and_the_setting(
    text: str, fragment: str
) -> None:
    with pytest.raises(ConfigurationError, match=r"^the tokens file, ") as refused:
        _tokens.parse(text)
    assert fragment in str(refused.value)
    assert "sw_not" not in str(refused.value)  # a token put there by mistake is not shown


def test_a_client_given_an_entry_the_destinations_file_lacks_is_refused() -> None:
    text = f"defaults destinations=shop\nb submit {DIGEST} destinations=shop,other\n"
    assert len(_tokens.parse(text, destinations={"shop", "other"})) == 1
    with pytest.raises(ConfigurationError) as refused:
        _tokens.parse(text, destinations={"shop"})
    assert str(refused.value) == (
        "the tokens file, line 2: the setting destinations: the destinations file has no "
        "entry 'other' (its entries: shop)"
    )
    with pytest.raises(ConfigurationError, match="line 1: the setting destinations"):
        _tokens.parse(text, destinations=set())


def test_api_token_prints_a_line_with_its_settings_and_its_help_lists_them() -> None:
    out = assert_ok(
        invoke(
            "api-token",
            "billing",
            "--scope",
            "submit",
            "--set",
            "submit_rate=2",
            "--set",
            "channels=orders,{client}.*",
        )
    )
    token, line = out.splitlines()[1], out.splitlines()[3]
    assert line.endswith(" submit_rate=2 channels=orders,{client}.*")
    [client] = _tokens.parse(line).clients
    assert client.digest == hashlib.sha256(token.encode()).digest()
    assert client.setting(_tokens.SUBMIT_RATE) == 2.0
    out = assert_ok(
        invoke("api-token", "reports", env={"STEPWARDEN_API_TOKEN_SCOPE": "read",
                                            "STEPWARDEN_API_TOKEN_SET": "polls=3 streams=4"})
    )  # fmt: skip
    assert out.splitlines()[3].endswith(" polls=3 streams=4")
    assert_refused(
        invoke("api-token", "billing", "--scope", "read", "--set", "polls=many"),
        "the setting polls: expected a whole number",
        exit_code=2,
    )
    shown = " ".join(assert_ok(invoke("api-token", "--help")).split())
    assert "--set SETTING=VALUE" in shown
    for setting in _tokens.SETTINGS.values():
        default = setting.show(setting.default) or "none"
        assert f"{setting.name}={setting.kind.form} ({setting.means}; default {default})" in shown


def test_the_tokens_file_is_read_again_when_it_changes_and_a_wrong_one_keeps_the_last(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = [0.0]
    path = tmp_path / "api-tokens"
    path.write_text(f"a submit {DIGEST}\nb read {OTHER}\n")
    path.chmod(0o600)
    tokens = _tokens.TokensFile(path, clock=lambda: now[0])

    def names() -> list[str]:
        return [c.name for c in tokens.clients().clients]

    assert names() == ["a", "b"]
    path.write_text(f"a submit {DIGEST}\n")  # b's token revoked
    assert names() == ["a", "b"]  # looked at once a second at most
    now[0] = 1.0
    assert names() == ["a"]
    caplog.set_level("ERROR", logger="stepwarden.tokens")
    path.write_text(f"a submit {DIGEST}\nc cancel,ship {OTHER}\n")
    for second in range(2, 8):  # looked at again and again: one error
        now[0] = second
        assert names() == ["a"]
    [logged] = caplog.records
    assert "line 2: unknown scope 'ship'" in logged.getMessage()
    assert "the 1 client(s) read before are kept" in logged.getMessage()
    path.write_text(f"a submit {DIGEST}\nc cancel {OTHER}\n")
    now[0] = 9.0
    assert names() == ["a", "c"]
    path.chmod(0o622)
    now[0] = 10.0
    assert names() == ["a", "c"]
    path.unlink()
    now[0] = 11.0
    assert names() == ["a", "c"]
    errors = [r.getMessage() for r in caplog.records]
    assert len(errors) == 3
    assert "written by others than its owner" in errors[1]
    assert "cannot read the API tokens file" in errors[2]


async def test_a_served_tokens_file_is_taken_up_without_a_restart(
    store_url: str, tokens: Tokens, caplog: pytest.LogCaptureFixture
) -> None:
    """A token revoked is refused, a setting changed applies, and a file become wrong keeps
    the clients read before: each within about a second, the server running on."""

    def rewrite(text: str) -> None:  # as an operator should: a new file renamed over the old
        new = tokens.path.with_suffix(".new")
        new.write_text(text)
        new.chmod(0o600)
        new.replace(tokens.path)

    lines = tokens.path.read_text().splitlines()
    with serving(store_url, tokens.path, worker=False) as served:
        async with httpx.AsyncClient(base_url=served.url, timeout=TIMEOUT) as c:

            async def answer(who: str) -> int:
                found = await c.get("/api/v1/tasks/nope", headers=tokens.auth(who))
                return found.status_code

            assert await answer("reader") == 404
            rewrite("\n".join(line for line in lines if not line.startswith("reader ")))

            async def revoked() -> bool:
                return await answer("reader") == 401

            await until("the reader's token refused", revoked)
            assert await answer("billing") == 404

            rewrite("\n".join([*lines, "defaults priority=0..0"]))

            async def bounded() -> bool:
                sent = await c.post(
                    "/api/v1/tasks",
                    json={"workflow": "echo", "priority": 1},
                    headers=tokens.auth("submitter"),
                )
                assert sent.status_code in (201, 422), sent.text
                return sent.status_code == 422

            await until("the defaults line's priorities applied", bounded)
            assert await answer("reader") == 404  # back, with the file of every client

            caplog.set_level("ERROR", logger="stepwarden.tokens")
            rewrite("\n".join([*lines, "defaults priority=9..0"]))

            async def logged() -> bool:  # the file is looked at on requests
                assert await answer("billing") == 404
                return "the setting priority" in caplog.text

            await until("the wrong file's error logged", logged)
            assert await answer("reader") == 404  # the clients read before
            assert [r.levelname for r in caplog.records if r.name == "stepwarden.tokens"] == [
                "ERROR"
            ]


def test_the_guide_lists_every_setting_with_its_default() -> None:
    guide = Path(__file__).parents[2] / "docs" / "howto" / "http-api.md"
    rows = re.findall(r"^\| `([a-z_]+)=[^`]*` \| `?([^|`]*?)`? \|", guide.read_text(), re.M)
    shown = {s.name: s.show(s.default) or "none" for s in _tokens.SETTINGS.values()}
    assert dict(rows) == shown


def test_the_dashboard_refuses_a_wrong_destinations_file_or_a_client_given_another_entry(
    tmp_path: Path,
) -> None:
    store = f"sqlite:///{tmp_path / 'store.db'}"
    listed = tmp_path / "destinations"
    listed.write_text("shop redis://127.0.0.1:6390 status.*\nshop amqp://rabbit x\n")
    assert_refused(
        invoke("--store", store, "dashboard", "--destinations", str(listed), "--port", "0"),
        "line 2: the entry 'shop' is named twice",
        exit_code=2,
    )
    listed.write_text("shop redis://127.0.0.1:6390 status.*\n")
    clients = tmp_path / "api-tokens"
    clients.write_text(f"billing submit {DIGEST} destinations=shop,other\n")
    clients.chmod(0o600)
    args = ["--store", store, "dashboard", "--api-tokens", str(clients), "--port", "0"]
    assert_refused(
        invoke(*args, env={"STEPWARDEN_DESTINATIONS": str(listed)}),
        "line 1: the setting destinations: the destinations file has no entry 'other' (its "
        "entries: shop)",
        exit_code=2,
    )
    assert_refused(
        invoke(*args, "--destinations", str(listed)),
        "the destinations file has no entry 'other'",
        exit_code=2,
    )
