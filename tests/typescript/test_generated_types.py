"""The TypeScript library's protocol types are generated from the server's own OpenAPI
document: the checked-in `clients/typescript/openapi.json` is the document a server answers
(`/api/v1/openapi.json`), and `src/generated/openapi.ts` is what openapi-typescript (the
version package-lock.json pins) generates from it. Either test fails when its file is stale:
`python -m tests.typescript.document`, then `npm run generate` (in clients/typescript),
write them again."""

from __future__ import annotations

import json
import shutil

from ..support.typescript import PACKAGE, installed_dependencies, run_command
from .document import DOCUMENT, served_document, text

STALE = "stale: write it again with `python -m tests.typescript.document`"


async def test_the_checked_in_document_is_the_servers() -> None:
    served = await served_document()
    assert json.loads(DOCUMENT.read_text()) == served, f"{DOCUMENT} is {STALE}"
    assert DOCUMENT.read_text() == text(served), f"{DOCUMENT} is {STALE}"


def test_the_generated_types_are_current() -> None:
    installed_dependencies()
    npm = shutil.which("npm")
    assert npm, "npm is not installed: the TypeScript library needs Node 20+"
    # --check: openapi-typescript generates the types again and fails when they differ.
    run_command([npm, "run", "--silent", "generate", "--", "--check"], cwd=PACKAGE, timeout=120)
