"""The README's first example as a user runs it, on PostgreSQL: `stepwarden worker shop:app`
in one process, `python shop.py` in another. The script gets its result and ends cleanly:
leaving `with app:` closes what the App opened (the pool's tasks, the listener, the thread
of its blocking calls), so nothing is left pending for the interpreter to destroy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.cli.helpers import STEPWARDEN, process_env
from tests.rawsql import sql

from ..support.readme import PAYMENTS, first_example

ROOT = Path(__file__).resolve().parents[2]
LEFT_PENDING = "Task was destroyed but it is pending"


def test_the_first_example_gets_its_result_and_ends_cleanly_on_postgres(
    pg_url: str, tmp_path: Path
) -> None:
    code = first_example()
    assert 'store="sqlite:///shop.db"' in code
    (tmp_path / "shop.py").write_text(code.replace('"sqlite:///shop.db"', repr(pg_url)) + PAYMENTS)
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        [STEPWARDEN, "worker", "shop:app"],
        cwd=tmp_path,
        env=process_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        run = subprocess.run(
            [sys.executable, "shop.py"],
            cwd=tmp_path,
            env=process_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        log.close()
    worker_log = (tmp_path / "worker.log").read_text()
    # It ends at once, its result read (app.result raises when the task does not succeed).
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{worker_log}"
    assert LEFT_PENDING not in run.stderr, run.stderr
    assert run.stderr == "", run.stderr
    [(state, result)] = sql(pg_url, "SELECT process_state, result FROM stepwarden_tasks")
    assert (state, result) == ("processed", {"receipt": {"charged": 42, "key": "order-42/2"}})


SCRIPTS = {
    "with": """
with stepwarden.App("shop", store=URL) as app:
    app.workflow(order)
    app.submit(order, {}, task_id="t-with")
    print(app.status("t-with").process_state)
""",
    "async with": """
async def main() -> None:
    async with stepwarden.App("shop", store=URL) as app:
        app.workflow(order)
        await app.submit_async(order, {}, task_id="t-async-with")
        print((await app.status_async("t-async-with")).process_state)

asyncio.run(main())
""",
}


def test_an_app_left_by_its_block_leaves_nothing_pending(pg_url: str, tmp_path: Path) -> None:
    """A script that only submits and reads a status, the App closed by `with` (and by
    `async with` in async code) before the interpreter ends."""
    for form, body in SCRIPTS.items():
        script = tmp_path / "submit.py"
        script.write_text(
            "import asyncio\nimport stepwarden\n"
            f"URL = {pg_url!r}\n"
            "async def order(ctx: stepwarden.Context, order: dict) -> None: ...\n" + body
        )
        run = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=process_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 0, (form, run.stderr)
        assert run.stdout.strip() == "pending", (form, run.stdout)
        assert LEFT_PENDING not in run.stderr and run.stderr == "", (form, run.stderr)
