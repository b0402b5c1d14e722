"""A deploy while tasks run: workers on the first release of a workflow are replaced by
workers on a release that inserts a step behind `ctx.patched`. The tasks the old code took
past that place finish on the old path; the tasks started after the deploy take the new one."""

from __future__ import annotations

from collections import Counter

import pytest

from . import scenario_app
from .harness import COMPLETED, PROCESSED, Cluster

pytestmark = pytest.mark.slow

OLD = [f"old-{i}" for i in range(100)]
NEW = [f"new-{i}" for i in range(100)]


def test_a_deploy_that_inserts_a_patched_step_keeps_old_tasks_on_the_old_path(
    cluster: Cluster,
) -> None:
    c = cluster
    release = c.workdir / "release"
    charge = {"async": True, "idempotent": True, "block_until": str(release), "block_limit": 120}
    old_worker = c.start("release-1", "--agent-concurrency", "200")
    c.app.submit_many([c.app.new_task("deploy", charge, task_id=t) for t in OLD])

    def all_charging() -> bool:
        started = {x["task_id"] for x in c.calls() if x["seq"] == 2}
        return started >= set(OLD)

    c.wait_until(all_charging, "every old task to reach its charge", timeout=60)
    # The deploy: the old release dies mid-call (its charges block) and the new one starts.
    c.kill(old_worker)
    new_env = {scenario_app.RELEASE_ENV: "2"}
    c.start("release-2a", "--agent-concurrency", "200", env=new_env)
    c.start("release-2b", "--agent-concurrency", "200", env=new_env)
    c.app.submit_many([c.app.new_task("deploy", charge, task_id=t) for t in NEW])
    release.touch()

    for t in OLD + NEW:
        c.wait_finished(t, timeout=120)
    effects = Counter(x["key"] for x in c.effects())
    for t in OLD + NEW:
        view = c.app.show(t)
        why = c.why(f"effects of {t}: {[k for k in effects if k.startswith(t + '/')]}", t)
        assert view.task.process_state == PROCESSED, why
        want = ["reserve", "charge"] if t in OLD else ["reserve", "fraud", "charge"]
        assert [s.name for s in sorted(view.steps, key=lambda s: s.seq)] == want, why
        assert all(s.state == COMPLETED for s in view.steps), why
        # Each step's effect was applied once, whatever was called again after the kill.
        assert {k: n for k, n in effects.items() if k.startswith(t + "/")} == {
            s.idempotency_key: 1 for s in view.steps
        }, why
