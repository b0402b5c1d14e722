"""Run the orders example end to end, with faults on and a worker killed mid-run.

What it does:
1. starts the payment service (a real HTTP server) with faults: 503s, answers slower than the
   charge's complete_by, answers dropped after the charge is applied, an outage window, and
   crashes (the service is restarted each time it dies, on the same port and ledger);
2. starts several worker processes (`stepwarden worker examples.orders.shop:app`), each with
   a scheduler, the agents and a supervisor;
3. places the orders: each order row and its task are committed in one transaction;
4. kills one worker with SIGKILL once part of the orders are done, and starts a replacement;
5. approves the orders above the shop's threshold as they wait for it (an `approved` event),
   but for a few, which time out and are undone;
6. waits until every order is finished (processed; or compensated: its charge refunded and
   its reservation released), then prints a summary: submitted, processed, compensated,
   error, lost, retries, deadlines missed, duplicate effects prevented by the idempotency keys
   and duplicate effects applied. It exits 1 if an order was lost, an effect applied twice,
   or an order left charged without being processed. A temporary work folder (the store,
   the ledger, the logs) is removed after a good run, unless --keep.

With --ts-shipping, the shipping agent is served by the TypeScript library's example agent
(clients/typescript/examples/shipping.ts, compiled into the workdir; Node 20+ and npm needed)
over the agent protocol of a `stepwarden dashboard` the demo starts, and the workers serve
inventory and payments only; the TypeScript agent is killed with SIGKILL beside the worker,
and replaced.

    python -m examples.orders.demo [--orders 300] [--workers 3] [--ts-shipping] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import httpx
from tqdm import tqdm  # type: ignore[import-untyped]

from examples.orders import payment_service
from stepwarden import TaskState
from stepwarden.store.ports import ReadPort

ROOT = Path(__file__).resolve().parents[2]
TYPESCRIPT = ROOT / "clients" / "typescript"
ITEMS = ["book", "lamp", "mug", "pen", "shirt", "tea"]
FINISHED = (
    TaskState.PROCESSED,
    TaskState.COMPENSATED,
    TaskState.ERROR,
    TaskState.COMPENSATION_FAILED,
    TaskState.CANCELLED,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m examples.orders.demo", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--orders", type=int, default=300, help="orders to place (default 300)")
    p.add_argument("--workers", type=int, default=3, help="worker processes (default 3)")
    p.add_argument("--store", help="store URL (default: an SQLite file in --workdir)")
    p.add_argument(
        "--workdir",
        help="where the store, ledger and logs go, kept (default: a new temporary folder, "
        "removed at the end unless --keep or the run failed)",
    )
    p.add_argument(
        "--keep", action="store_true", help="keep the temporary folder (its path is printed)"
    )
    p.add_argument("--declined", type=float, default=0.03, help="share of declined cards")
    p.add_argument(
        "--undeliverable",
        type=float,
        default=0.03,
        help="share of orders shipping refuses after the charge (refunded)",
    )
    p.add_argument("--kill-at", type=float, default=0.3, help="kill a worker at this progress")
    p.add_argument(
        "--unapproved",
        type=float,
        default=0.1,
        help="share of the orders awaiting approval that are never approved (time out)",
    )
    p.add_argument(
        "--approval-within",
        type=float,
        default=3.0,
        help="seconds an order waits for its approval (default 3)",
    )
    p.add_argument("--no-kill", action="store_true", help="kill no worker")
    p.add_argument("--no-faults", action="store_true", help="a payment service without faults")
    p.add_argument(
        "--ts-shipping",
        action="store_true",
        help="serve the shipping agent with the TypeScript agent runner (Node 20+)",
    )
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--timeout", type=float, default=300, help="give up after this many seconds")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    args = p.parse_args(argv)
    if args.orders < 1 or args.workers < 1:
        p.error("--orders and --workers must be at least 1")
    return args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Processes:
    """The demo's child processes: the payment service, kept alive, and the workers."""

    workdir: Path
    env: dict[str, str]
    service_args: list[str]
    seed: int
    service: subprocess.Popen[bytes] | None = None
    service_restarts: int = 0
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    workers_killed: int = 0
    agents: list[str] | None = None
    """The agents the workers serve (None: all of them)."""
    shipping: TypeScriptShipping | None = None
    shipping_agents: list[subprocess.Popen[bytes]] = field(default_factory=list)
    shipping_agents_killed: int = 0
    _logs: list[Any] = field(default_factory=list)

    def _log(self, name: str) -> Any:
        f = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop()
        self._logs.append(f)
        return f

    def start_service(self) -> None:
        # A restarted service draws new faults: the same seed would crash it at the same point.
        seed = ["--seed", str(self.seed + self.service_restarts)]
        cmd = [sys.executable, "-m", "examples.orders.payment_service", *self.service_args, *seed]
        log = self._log("payment-service")
        self.service = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=log)

    def service_died(self) -> bool:
        return self.service is not None and self.service.poll() is not None

    def start_worker(self, roles: str = "scheduler,agents,supervisor") -> subprocess.Popen[bytes]:
        n = len(self.workers) + 1
        cmd = [
            sys.executable,
            "-c",
            "from stepwarden.cli import main; main()",
            "--app",
            "examples.orders.shop:app",
            "worker",
            "--roles",
            roles,
            "--supervisor-interval",
            "0.5",
            "--lease-ttl",
            "3",
            "--backoff-initial",
            "0.2",
            "--backoff-max",
            "2",
        ]
        if self.agents is not None:
            cmd += ["--agents", ",".join(self.agents)]
        log = self._log(f"worker-{n}-{roles.replace(',', '+')}")
        worker = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=log, stderr=log)
        self.workers.append(worker)
        return worker

    def kill_worker(self) -> int:
        victim = next(w for w in self.workers if w.poll() is None)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        self.workers_killed += 1
        return victim.pid

    def start_shipping_agent(self) -> None:
        """The TypeScript shipping agent (its steps are served by no worker)."""
        assert self.shipping is not None
        n = len(self.shipping_agents) + 1
        env = {
            **self.env,
            "STEPWARDEN_URL": self.shipping.url,
            "STEPWARDEN_AGENT_TOKEN": self.shipping.token,
        }
        log = self._log(f"shipping-ts-{n}")
        self.shipping_agents.append(
            subprocess.Popen(
                ["node", str(self.shipping.script)], cwd=ROOT, env=env, stdout=log, stderr=log
            )
        )

    def kill_shipping_agent(self) -> int:
        victim = next(a for a in self.shipping_agents if a.poll() is None)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        self.shipping_agents_killed += 1
        return victim.pid

    def stop(self) -> None:
        # The TypeScript agents first: they leave the registry through the server.
        self._terminate(self.shipping_agents)
        self._terminate([*self.workers, *([self.shipping.server] if self.shipping else [])])
        if self.service is not None and self.service.poll() is None:
            self.service.terminate()
            self.service.wait()
        for f in self._logs:
            f.close()

    @staticmethod
    def _terminate(children: list[subprocess.Popen[bytes]]) -> None:
        for w in children:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in children:
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()


@dataclass
class TypeScriptShipping:
    """The agent protocol's server (`stepwarden dashboard` with a client's token that serves
    `shipping`), and the compiled TypeScript agent that serves it."""

    server: subprocess.Popen[bytes]
    url: str
    token: str
    script: Path


def build_typescript(workdir: Path) -> Path:
    """Compile the TypeScript library and its examples into the workdir (its dependencies
    installed with `npm ci` first, when they are not); the example shipping agent's path."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            raise SystemExit(f"--ts-shipping needs Node 20+ and npm: {tool} is not installed")
    with (TYPESCRIPT / ".install.lock").open("w") as lock:  # one install at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (TYPESCRIPT / "node_modules" / ".bin" / "tsc").exists():
            subprocess.run(
                ["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund"],
                cwd=TYPESCRIPT,
                check=True,
                stdout=subprocess.DEVNULL,
            )
    out = workdir / "typescript"
    tsc = TYPESCRIPT / "node_modules" / ".bin" / "tsc"
    subprocess.run([str(tsc), "-p", str(TYPESCRIPT), "--outDir", str(out)], check=True)
    (out / "package.json").write_text('{"type": "module"}\n')
    return out / "examples" / "shipping.js"


def serve_agent_protocol(procs: Processes, script: Path) -> TypeScriptShipping:
    """Start `stepwarden dashboard` with a tokens file naming one client, `shipper`, whose
    token serves the agent `shipping`; wait until it answers."""
    from stepwarden import dashboard

    token, line = dashboard.new_api_client("shipper", ["agent:shipping"])
    tokens = procs.workdir / "api-tokens"
    tokens.write_text(line + "\n")
    tokens.chmod(0o600)
    port = free_port()
    env = {**procs.env, "STEPWARDEN_DASHBOARD_TOKEN": secrets.token_urlsafe(24)}
    cmd = [
        sys.executable,
        "-c",
        "from stepwarden.cli import main; main()",
        "--app",
        "examples.orders.shop:app",
        "dashboard",
        "--port",
        str(port),
        "--api-tokens",
        str(tokens),
    ]
    log = procs._log("dashboard")
    server = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    with httpx.Client() as client:
        while True:
            try:
                if client.get(f"{url}/api/v1/openapi.json", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the dashboard did not start: see {procs.workdir}")
            time.sleep(0.05)
    return TypeScriptShipping(server=server, url=url, token=token, script=script)


def make_orders(
    n: int, declined: float, undeliverable: float, rng: random.Random
) -> list[dict[str, Any]]:
    return [
        {
            "id": f"{i:05d}",
            "amount": round(rng.uniform(5, 200), 2),
            "card": "declined" if rng.random() < declined else "ok",
            "address": "nowhere" if rng.random() < undeliverable else "street",
            "items": rng.sample(ITEMS, rng.randint(1, 3)),
        }
        for i in range(1, n + 1)
    ]


async def wait_for_service(url: str, procs: Processes, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as client:
        while True:
            try:
                if (await client.get(f"{url}/stats", timeout=1)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if procs.service_died() or time.monotonic() > deadline:
                raise SystemExit(f"the payment service did not start: see {procs.workdir}")
            await asyncio.sleep(0.05)


class Summary(TypedDict):
    """What a run did, as printed at its end (and as JSON with --json)."""

    submitted: int
    processed: int
    compensated: int
    error: int
    lost: int
    retries: int
    deadlines_missed: int
    duplicate_effects_prevented: int
    duplicate_effects_applied: int
    charges_applied: int
    refunds_applied: int
    charged_not_processed: int
    awaiting_approval: int
    approved: int
    approval_timeouts: int
    workers_killed: int
    shipping_agent: str
    shipping_agents_killed: int
    payment_service_crashes: int
    seconds: float
    workdir: NotRequired[str]
    """The folder of the store, ledger and logs; left out once removed (a temporary one, after a
    good run)."""


async def run(args: argparse.Namespace, procs: Processes, url: str) -> Summary:
    from examples.orders import shop  # reads STEPWARDEN_STORE and PAYMENTS_URL

    rng = random.Random(args.seed)
    orders = make_orders(args.orders, args.declined, args.undeliverable, rng)
    never = {
        f"order-{o['id']}"
        for o in orders
        if o["amount"] > shop.APPROVAL_ABOVE and rng.random() < args.unapproved
    }
    async with shop.app:  # its store closed however the run ends
        approved: set[str] = set()
        store = await shop.app.store()
        await shop.create_orders_table()
        for _ in range(args.workers):
            procs.start_worker()
        if procs.shipping is not None:
            procs.start_shipping_agent()

        started = time.monotonic()
        task_ids: list[str] = []
        kill_when = None if args.no_kill else max(1, int(args.orders * args.kill_at))
        killed_pid = None
        bar = tqdm(total=len(orders), unit="order", desc="orders", disable=None, file=sys.stderr)
        done = 0
        next_order = 0
        while done < len(orders):
            if procs.service_died():
                procs.service_restarts += 1
                procs.start_service()
            # Orders arrive in small bursts while the workers run.
            for order in orders[next_order : next_order + 25]:
                task_ids.append(await shop.place_order(order))
            next_order += 25
            # A person approves the orders waiting for it (but for a few, which time out).
            for task in await store.list_tasks(state=TaskState.WAITING, limit=1000):
                if task.task_id not in never and task.task_id not in approved:
                    await shop.app.send_event_async(
                        task.task_id,
                        "approved",
                        {"by": "demo"},
                        event_id=f"approval-{task.task_id}",
                    )
                    approved.add(task.task_id)
            counts = await store.count_tasks()
            now_done = sum(counts.get(s, 0) for s in FINISHED)
            bar.update(now_done - done)
            done = now_done
            if kill_when is not None and killed_pid is None and done >= kill_when:
                killed_pid = procs.kill_worker()
                bar.write(
                    f"killed worker pid {killed_pid} with SIGKILL; started a replacement",
                    file=sys.stderr,
                )
                procs.start_worker()
                if procs.shipping is not None:
                    killed_agent = procs.kill_shipping_agent()
                    bar.write(
                        f"killed the TypeScript shipping agent pid {killed_agent} with "
                        "SIGKILL; started a replacement",
                        file=sys.stderr,
                    )
                    procs.start_shipping_agent()
            if time.monotonic() - started > args.timeout:
                bar.write(f"gave up after {args.timeout:.0f}s", file=sys.stderr)
                break
            await asyncio.sleep(0.1)
        elapsed = time.monotonic() - started
        bar.close()
        procs.stop()
        return await summarise(store, task_ids, procs, elapsed, len(approved))


async def summarise(
    store: ReadPort, task_ids: list[str], procs: Processes, elapsed: float, approved: int
) -> Summary:
    states: dict[str, int] = {s: 0 for s in ("processed", "compensated", "error")}
    retries = 0
    unfinished = 0
    waits: list[str] = []
    for task_id in task_ids:
        task = await store.get_task(task_id)
        if task is None or str(task.process_state) not in states:
            unfinished += 1
            continue
        states[str(task.process_state)] += 1
        waits.extend(w.state for w in await store.waits(task_id))
        for step in await store.get_steps(task_id):
            retries += (step.attempt - 1) + max(0, step.tries - 1)
    ledger = payment_service.read_stats(str(procs.workdir / "ledger.db"))
    expired = await store.events(kind="expired", limit=1_000_000)
    return {
        "submitted": len(task_ids),
        "processed": states["processed"],
        "compensated": states["compensated"],
        "error": states["error"],
        "lost": unfinished,
        "retries": retries,
        "deadlines_missed": len(expired),
        "duplicate_effects_prevented": ledger["duplicates_prevented"],
        "duplicate_effects_applied": ledger["orders_charged_twice"]
        + ledger["orders_refunded_twice"],
        "charges_applied": ledger["charges"],
        "refunds_applied": ledger["refunds"],
        # The saga holds: an order is charged (and not refunded) if and only if processed.
        "charged_not_processed": ledger["orders_charged_not_refunded"] - states["processed"],
        "awaiting_approval": len(waits),
        "approved": approved,
        "approval_timeouts": waits.count("timed_out"),
        "workers_killed": procs.workers_killed,
        "shipping_agent": "typescript" if procs.shipping is not None else "python",
        "shipping_agents_killed": procs.shipping_agents_killed,
        "payment_service_crashes": procs.service_restarts,
        "seconds": round(elapsed, 1),
        "workdir": str(procs.workdir),
    }


NOTES = {
    "compensated": "(declined, undeliverable or unapproved: undone)",
    "duplicate_effects_prevented": "(the payment service saw the same idempotency key)",
    "awaiting_approval": "(orders over 150 that reached the approval step)",
    "approval_timeouts": "(undone: refunded, released)",
}
"""What a line of the summary means, printed after it."""


def print_table(summary: Summary) -> None:
    width = max(len(k) for k in summary)
    print()
    for key, value in summary.items():
        note = NOTES.get(key, "")
        if key == "charged_not_processed" and value == 0:
            note = "(every order still charged was processed)"
        name = key.replace("_", " ")
        print(f"  {name:<{width}}  {value!s:<9} {note}" if note else f"  {name:<{width}}  {value}")
    print("\n  " + ("OK: nothing lost, nothing applied twice" if healthy(summary) else "FAILED"))


def healthy(summary: Summary) -> bool:
    return (
        summary["lost"] == 0
        and summary["duplicate_effects_applied"] == 0
        and summary["charged_not_processed"] == 0
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="stepwarden-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    store = args.store or f"sqlite:///{workdir / 'shop.db'}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    faults = (
        []
        if args.no_faults
        else [
            "--transient", "0.1",
            "--slow", "0.03", "--slow-for", "3",
            "--lost", "0.03",
            "--crash", "0.004",
            "--outage-start", "4", "--outage-for", "2",
        ]
    )  # fmt: skip
    service_args = ["--port", str(port), "--ledger", str(workdir / "ledger.db"), *faults]
    os.environ["STEPWARDEN_STORE"] = store
    os.environ["PAYMENTS_URL"] = url
    os.environ["SHOP_APPROVAL_WITHIN"] = str(args.approval_within)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = Processes(workdir=workdir, env=env, service_args=service_args, seed=args.seed)
    try:
        if args.ts_shipping:
            script = build_typescript(workdir)
            procs.agents = ["inventory", "payments"]
            procs.shipping = serve_agent_protocol(procs, script)
        procs.start_service()
        asyncio.run(wait_for_service(url, procs))
        summary = asyncio.run(run(args, procs, url))
    finally:
        procs.stop()
    ok = healthy(summary)
    if args.workdir is None and not args.keep and ok:
        # A temporary folder is the demo's own: nothing in it is wanted after a good run.
        shutil.rmtree(workdir, ignore_errors=True)
        del summary["workdir"]
    if args.json:
        print(json.dumps(summary))
    else:
        print_table(summary)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
