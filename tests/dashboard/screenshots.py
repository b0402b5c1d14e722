"""Screenshots of the dashboard's main pages for the docs (docs/dashboard-*.png, shown by
docs/howto/dashboard.md and the tutorial), taken in headless Chromium from a real dashboard,
worker and SQLite store.

    .venv/bin/python -m tests.dashboard.screenshots [--out docs]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from .conftest import CHROMIUM, TOKEN, Served, store_of_kind, submit_orders, wait_for

PAGES = {
    "overview": "/",
    "tasks": "/tasks",
    "task": "/tasks/order-02",
    "agents": "/agents",
}


def populate(served: Served) -> None:
    """Orders that failed (the stamp pad was dry), then many processed, one retried by the
    operator, and one paused."""
    failing = {f"order-{n:02d}": n for n in range(1, 5)}
    submit_orders(served.store_url, failing)
    for task_id in failing:
        wait_for(f"{task_id} in error", served.in_state(task_id, "error"))
    served.flag.touch()
    done = {f"order-{n:02d}": n for n in range(5, 40)}
    submit_orders(served.store_url, done)
    for task_id in done:
        wait_for(f"{task_id} processed", served.in_state(task_id, "processed"))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    body = {"reason": "stamp pad refilled", "by": "alice"}
    assert served.post("/api/tasks/order-02/retry", json=body, headers=auth).status_code == 200
    wait_for("order-02 processed", lambda: served.state("order-02") == "processed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, store_of_kind("sqlite", Path(tmp), "") as url:
        served = Served(store_url=url, flag=Path(tmp) / "stamp-pad-refilled")
        try:
            served.start_dashboard()
            served.start_worker()
            populate(served)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
                page = browser.new_page(viewport={"width": 1280, "height": 860})
                page.goto(served.url + "/login?next=/")
                page.fill("input[name=token]", TOKEN)
                page.click("form.login button[type=submit]")
                for name, path in PAGES.items():
                    page.goto(served.url + path)
                    page.wait_for_load_state("networkidle")
                    target = args.out / f"dashboard-{name}.png"
                    page.screenshot(path=str(target), full_page=name != "tasks")
                    print(target)
                browser.close()
        finally:
            served.stop()


if __name__ == "__main__":
    main()
