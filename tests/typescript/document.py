"""The application API's OpenAPI document as a server serves it (`/api/v1/openapi.json`) for
an App that declares no workflow and no agent, so that workflow and agent names are any
name: the document the TypeScript library's types are generated from
(`clients/typescript/openapi.json`, `src/generated/openapi.ts`).

`python -m tests.typescript.document` writes it; `npm run generate` (in clients/typescript)
then generates the types from it."""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

import httpx

import stepwarden as sw
from stepwarden.dashboard import create_app

ROOT = Path(__file__).resolve().parents[2]
DOCUMENT = ROOT / "clients" / "typescript" / "openapi.json"


async def served_document() -> dict[str, Any]:
    """The document a server of an App of no workflow and no agent answers."""
    with tempfile.TemporaryDirectory() as folder:
        app = sw.App("document", store=f"sqlite:///{folder}/document.db")
        web = create_app(app, token="t" * 32)
        transport = httpx.ASGITransport(app=web)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            answer = await client.get("/api/v1/openapi.json")
            answer.raise_for_status()
            document: dict[str, Any] = answer.json()
            return document


def text(document: dict[str, Any]) -> str:
    """The document as the checked-in file holds it."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    DOCUMENT.write_text(text(asyncio.run(served_document())))
    print(f"wrote {DOCUMENT}")
