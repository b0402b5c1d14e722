"""The dashboard in a real browser: an operator finds a failed task, retries it and sees it
complete; requests without the token or the CSRF token change nothing; a secret is never
shown."""

from __future__ import annotations

import contextlib
import http.server
import re
import threading
from collections.abc import Iterator
from typing import Any

import httpx
from playwright.sync_api import Page, expect

from stepwarden.dashboard._auth import SESSION_COOKIE
from stepwarden.dashboard._data import WAITING_EVERY
from tests.cli.helpers import sql

from ..support.dashboard import AGENTS
from .conftest import TOKEN, Served, run_async, submit_orders, wait_for
from .dash_app import CARD, build, order

STEP_COUNTS = (
    "SELECT count(claimed_at), "
    "sum(CASE WHEN state = 'completed' THEN 1 ELSE 0 END), "
    "sum(CASE WHEN state = 'failed' THEN 1 ELSE 0 END) "
    "FROM stepwarden_steps WHERE agent = 'desk' AND operation = 'stamp'"
)


def sign_in(page: Page) -> None:
    page.click("#sign-in")
    page.fill("input[name=token]", TOKEN)
    page.click("form.login button[type=submit]")
    expect(page.locator("meta[name=csrf-token]")).to_have_count(1)


def test_the_overview_and_the_task_s_page_say_why_tasks_wait(served: Served, page: Page) -> None:
    page.goto(served.url + "/")
    row = page.locator("#waiting tr[data-reason=set_aside]")
    # The overview counts them again every 10 s (WAITING_EVERY); the page follows it live.
    expect(row.locator("td").nth(0)).to_have_text("2", timeout=(WAITING_EVERY + 10) * 1000)
    expect(row.locator("td").nth(2)).to_have_text("process")
    row.get_by_role("link", name=re.compile(r"^order-")).click()
    expect(page).to_have_url(re.compile(r"/tasks/order-[12]$"))
    holding = page.locator("#why-holding")
    expect(holding.locator("[data-reason]")).to_have_attribute("data-reason", "set_aside")
    expect(holding).to_contain_text("waits for an operator: error (alert task_error)")
    why = served.get("/api/why/order-2").json()
    assert why["gate"]["reason"] == "set_aside" and why["gate"]["alert"] == "task_error"


def test_a_failed_task_is_found_from_the_overview_retried_and_completes(
    served: Served, page: Page
) -> None:
    page.goto(served.url + "/")
    expect(page.locator(".card[data-state=error] .count")).to_have_text("2")
    expect(page.locator("#leader")).to_contain_text("supervisor-")  # the worker's supervisor
    expect(page.locator("#leader")).to_contain_text("sweeping")
    expect(page.locator("#leader")).to_contain_text("last sweep")
    page.locator("#failed-tasks").get_by_role("link", name="order-1", exact=True).click()
    expect(page).to_have_url(re.compile(r"/tasks/order-1$"))
    expect(page.locator("#task-state")).to_have_text("error")
    expect(page.locator("#steps .step-failed")).to_contain_text("the stamp pad is dry")

    sign_in(page)
    expect(page).to_have_url(re.compile(r"/tasks/order-1$"))  # back where the operator was
    page.evaluate("window.notReloaded = true")
    served.flag.touch()  # the operator fixed the fault
    page.fill("#reason", "pad refilled")
    page.click("#actions button[data-action=retry]")
    expect(page.locator("#flash")).to_have_text("retry: error → pending")

    # The page follows the task without being reloaded, until the worker has completed it.
    expect(page.locator("#task-state")).to_have_text("processed")
    assert page.evaluate("window.notReloaded") is True
    expect(page.locator("#steps .step-completed")).to_have_count(1)
    expect(page.locator("#task-result")).to_contain_text('"stamped": 1')
    operator = page.locator("#history tr.event-operator")
    expect(operator).to_contain_text("retry by dashboard (session): error → pending")
    expect(operator).to_contain_text("pad refilled")
    assert served.state("order-1") == "processed"


def test_actions_without_the_token_or_the_csrf_token_are_refused_and_change_nothing(
    served: Served, page: Page
) -> None:
    before = served.get("/api/tasks/order-2").json()
    assert before["task"]["process_state"] == "error"

    # No credentials, a wrong token, and a GET that would change state.
    assert served.post("/api/tasks/order-2/cancel").status_code == 401
    wrong = {"Authorization": "Bearer not-the-token"}
    assert served.post("/api/tasks/order-2/cancel", headers=wrong).status_code == 401
    bulk = {"action": "cancel", "state": "error"}
    assert served.post("/api/actions", json=bulk).status_code == 401
    assert served.get("/api/tasks/order-2/cancel").status_code == 404  # no GET action

    # A signed-in browser session whose request lacks the CSRF token (as a request forged by
    # another site would), or carries a wrong one.
    page.goto(served.url + "/tasks/order-2")
    sign_in(page)
    statuses = page.evaluate(
        """async () => {
            const post = (url, headers, body) => fetch(url, {method: "POST", headers: headers,
                body: body, credentials: "same-origin"}).then((r) => r.status);
            return [
                await post("/api/tasks/order-2/cancel", {}),
                await post("/api/tasks/order-2/cancel", {"X-CSRF-Token": "forged"}),
                await post("/api/actions", {"Content-Type": "application/json"},
                    JSON.stringify({action: "cancel", state: "error"})),
            ];
        }"""
    )
    assert statuses == [403, 403, 403]
    # A form posted from another page, with the cookie but without the token.
    refused = page.evaluate(
        """async () => (await fetch("/logout", {method: "POST", credentials: "same-origin",
            headers: {"Content-Type": "application/x-www-form-urlencoded"}})).status"""
    )
    assert refused == 403

    after = served.get("/api/tasks/order-2").json()
    assert after == before
    assert not [e for e in after["events"] if e["kind"] == "operator"]

    # The same session with its CSRF token is let through (a dry run: nothing changes).
    allowed = page.evaluate(
        """async () => {
            const token = document.querySelector("meta[name=csrf-token]").content;
            const r = await fetch("/api/actions", {method: "POST", credentials: "same-origin",
                headers: {"Content-Type": "application/json", "X-CSRF-Token": token},
                body: JSON.stringify({action: "cancel", task_ids: ["order-2"], dry_run: true})});
            return [r.status, await r.json()];
        }"""
    )
    assert allowed[0] == 200
    assert allowed[1]["outcomes"][0]["message"] == "would cancel: error -> cancelled"
    assert served.get("/api/tasks/order-2").json() == before


def test_a_secret_never_appears_in_any_page(served: Served, page: Page) -> None:
    shown: dict[str, str] = {}
    for path in ("/", "/tasks", "/tasks?state=error", "/tasks/order-1", "/tasks/order-2"):
        page.goto(served.url + path)
        page.locator("details").evaluate_all("(ds) => ds.forEach((d) => { d.open = true; })")
        shown[path] = page.content()
    for path in ("/alerts", "/agents"):
        page.goto(served.url + path)
        shown[path] = page.content()
    api = ("/api/overview", "/api/tasks", "/api/tasks/order-2", "/api/alerts", "/api/agents")
    for path in (*api, "/metrics"):
        response = served.get(path)
        assert response.status_code == 200
        shown[path] = response.text
    for path, text in shown.items():
        assert CARD not in text, path
    assert "task_error" in shown["/alerts"] and "order-1" in shown["/alerts"]
    # The input is shown, its secret masked.
    assert '"card": "***"' in shown["/tasks/order-2"]
    assert '"card":"***"' in shown["/api/tasks/order-2"]
    # Not by accident: the store holds it, and gives it to the operation.
    assert httpx.get(served.url + "/api/tasks/order-2").json()["task"]["input"]["id"] == 2


def test_the_agents_page_shows_the_worker_s_agent_instance(served: Served, page: Page) -> None:
    [(instance, capacity)] = sql(served.store_url, AGENTS)
    page.goto(served.url + "/")
    page.get_by_role("link", name="Agents").click()
    row = page.locator(f"#agents tr[data-instance='{instance}']")
    expect(row).to_have_attribute("data-agent", "desk")
    expect(row.locator("td").nth(2)).to_have_text("stamp")
    expect(row.locator("td").nth(3)).to_contain_text(f"/ {capacity}")
    expect(row.locator(".badge")).to_have_text("closed")
    expect(row.locator("td").nth(7)).to_have_text("yes")
    [counts] = sql(served.store_url, STEP_COUNTS)
    cells = page.locator("#operations tr", has_text="desk.stamp").locator("td")
    expect(cells).to_have_text(["desk.stamp", *(str(n) for n in counts), "0"])


LINES = """(selector) => [...document.querySelectorAll(selector)].map((e) => {
  const range = document.createRange();
  range.selectNodeContents(e);
  return [e.textContent.trim(), range.getClientRects().length];
})"""
"""Each element `selector` finds, with the number of lines its text is laid out on."""


def test_ids_and_tile_names_are_never_cut_in_two(served: Served, page: Page) -> None:
    """A generated-looking id stays on one line in every table (cut at its hyphen it reads
    as two ids), and a tile's state name is never broken inside a word, on a narrow window
    too."""
    long_id = "signup-49c0e1a7b3d24f5e8a6b1c9d0e2f"
    submit_orders(served.store_url, {long_id: 3})
    for width in (1280, 700, 390):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(served.url + "/")
        expect(page.locator(".card[data-state=compensation_failed] .label")).to_be_visible()
        labels = page.evaluate(LINES, ".card .label")
        assert {name for name, _ in labels} >= {"compensating", "compensation_failed"}
        assert [name for name, lines in labels if lines != 1] == [], (width, labels)
        page.goto(served.url + "/tasks")
        expect(page.get_by_role("link", name=long_id, exact=True)).to_be_visible()
        ids = page.evaluate(LINES, "td a")
        assert [name for name, lines in ids if lines != 1] == [], (width, ids)
        page.goto(served.url + "/agents")
        instances = page.evaluate(LINES, "code.id")
        assert instances and [n for n, lines in instances if lines != 1] == [], instances


def _submit_processed(served: Served, task_id: str, n: int, **options: Any) -> None:
    """An order the worker completes (the stamp pad refilled), submitted with `options`."""
    served.flag.touch()

    async def go() -> None:
        app = build(served.store_url, None)
        try:
            await app.submit_async("process", order(n), task_id=task_id, **options)
        finally:
            await app.aclose()

    run_async(go())
    wait_for(f"{task_id} processed", served.in_state(task_id, "processed"))


def test_a_finished_task_is_forked_from_its_page_its_plan_shown_first(
    served: Served, page: Page
) -> None:
    _submit_processed(served, "order-7", 7)
    page.goto(served.url + "/tasks/order-7")
    sign_in(page)
    expect(page.locator("#redrive button[data-redrive=retry-plan]")).to_have_count(0)
    page.select_option("#fork-from", "1")
    page.click("#redrive button[data-redrive=fork-plan]")
    flash = page.locator("#flash")
    expect(flash).to_contain_text("would fork as order-7~fork-")
    expect(flash).to_contain_text("step 1 at 1 desk.stamp: run again, same key (key order-7/1)")
    listed = served.get("/api/tasks?workflow=process&limit=500").json()["tasks"]
    assert "order-7" in {t["task_id"] for t in listed}
    assert not [t for t in listed if t["task_id"].startswith("order-7~")]  # nothing forked

    page.check("#fork-new-keys")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#redrive button[data-redrive=fork]")
    expect(flash).to_contain_text("forked as order-7~fork-")
    expect(flash).to_contain_text("run again, new key")
    forked = re.search(r"forked as (\S+)", flash.inner_text())
    assert forked is not None
    new_id = forked.group(1)
    wait_for(f"{new_id} processed", served.in_state(new_id, "processed"))
    [step] = served.get(f"/api/tasks/{new_id}").json()["steps"]
    assert step["idempotency_key"] == f"{new_id}/1"  # a new key, as asked
    page.goto(served.url + "/tasks/order-7")
    expect(page.locator("#history tr.event-operator")).to_contain_text("fork")


def test_a_tag_on_a_task_s_page_lists_the_tasks_of_that_tag(served: Served, page: Page) -> None:
    _submit_processed(served, "order-8", 8, tags={"region": "eu-west"})
    _submit_processed(served, "order-9", 9, tags={"region": "us-east"})
    page.goto(served.url + "/tasks/order-8")
    tag = page.locator("#tags a.tag")
    expect(tag).to_have_text("region=eu-west")
    tag.click()
    expect(page).to_have_url(re.compile(r"/tasks\?tag=region%3Deu-west$"))
    expect(page.locator("#tasks tr[data-task]")).to_have_count(1)
    expect(page.locator("#tasks tr[data-task=order-8]")).to_have_count(1)


def test_bulk_actions_by_filter_dry_run_first(served: Served, page: Page) -> None:
    """Last in this module: it cancels every task still in error (order-2)."""
    page.goto(served.url + "/")
    sign_in(page)
    page.goto(served.url + "/tasks")
    page.select_option("#filters select[name=state]", "error")
    page.click("#filters button[type=submit]")
    expect(page).to_have_url(re.compile(r"/tasks\?state=error"))
    expect(page.locator("#tasks tr[data-task]")).to_have_count(1)

    page.select_option("#bulk select[name=action]", "cancel")
    page.click("#bulk button[type=submit]")  # a dry run: the box is checked at first
    expect(page.locator("#flash")).to_contain_text("Dry run, nothing changed: 1 would change")
    expect(page.locator("#flash")).to_contain_text("order-2: would cancel: error -> cancelled")
    assert served.state("order-2") == "error"

    page.uncheck("#bulk input[name=dry_run]")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#bulk button[type=submit]")
    expect(page.locator("#flash")).to_contain_text("1 changed, 0 refused, of 1")
    # The list follows without a reload: no task is left in error.
    expect(page.locator("#tasks tr[data-task]")).to_have_count(0)
    assert served.state("order-2") == "cancelled"


ATTACKER_PAGE = """<!doctype html><html><body>
<form id="sign-in" method="post" action="{dashboard}/login">
  <input name="token" value="{token}"></form>
<script>
(async () => {{
  for (let i = 0; i < 12; i++) {{
    await fetch("{dashboard}/login", {{method: "POST", mode: "no-cors",
                                      body: new URLSearchParams({{token: "wrong-" + i}})}});
  }}
  window.sent = true;
}})();
</script></body></html>"""


@contextlib.contextmanager
def _other_site(page_html: str) -> Iterator[str]:
    """A web server of another site (`localhost`, where the dashboard is `127.0.0.1`) that
    serves one page."""

    class OnePage(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page_html.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OnePage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_a_page_of_another_site_can_neither_lock_the_sign_in_out_nor_sign_a_browser_in(
    served: Served, page: Page
) -> None:
    """A page of another site makes the browser post twelve wrong tokens to the sign-in (as
    the review did with `fetch(..., {mode: "no-cors"})`), then submits a sign-in form with a
    right token (to sign the browser in as it likes). The dashboard refuses each of these
    requests (the browser sees 403 from the server itself), counts none of them against the
    address, and sets no session."""
    answers: list[tuple[str, int]] = []
    page.on(
        "response",
        lambda r: (
            answers.append((r.request.method, r.status)) if r.url.startswith(served.url) else None
        ),
    )
    html = ATTACKER_PAGE.format(dashboard=served.url, token=TOKEN)
    with _other_site(html) as url:
        page.goto(url)
        page.wait_for_function("window.sent === true")
        with page.expect_response(served.url + "/login"):
            page.evaluate("document.getElementById('sign-in').submit()")
    assert answers == [("POST", 403)] * 13, answers
    assert not [c for c in page.context.cookies(served.url) if c["name"] == SESSION_COOKIE]
    # None of the thirteen counted: the first wrong sign-in of a program from this address is
    # a 401, not a 429; a right one signs in.
    assert served.post("/login", data={"token": "wrong"}).status_code == 401
    signed_in = served.post("/login", data={"token": TOKEN}, follow_redirects=False)
    assert signed_in.status_code == 303, signed_in.text
