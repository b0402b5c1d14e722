"""The clients' tokens: `stepwarden api-token` makes one and its line for the tokens file
(printed, or appended to the file), the file keeps only each token's SHA-256 digest, and a
file that is wrong in any way is refused naming the line at fault."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest

from stepwarden import ConfigurationError, _tokens
from tests.cli.helpers import assert_ok, assert_refused, invoke


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
