// The dashboard's behaviour: live updates (the page's #live part is fetched again every
// second) and operator actions (POST to the JSON API with the session's CSRF token).
"use strict";
(function () {
  const REFRESH_MS = 1000;

  // A task id as a path segment: "." and ".." written with %2E, or they would be resolved
  // away.
  function segment(value) {
    return value === "." || value === ".." ? value.replace(/\./g, "%2E") : encodeURIComponent(value);
  }

  function csrf() {
    const meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.content : null;
  }

  function flash(text, kind) {
    const box = document.getElementById("flash");
    if (!box) return;
    box.textContent = text;
    box.className = kind;
  }

  function flashList(lines, kind) {
    const box = document.getElementById("flash");
    if (!box) return;
    box.replaceChildren();
    for (const line of lines) {
      const div = document.createElement("div");
      div.textContent = line;
      box.appendChild(div);
    }
    box.className = kind;
  }

  let refreshing = false;
  async function refresh() {
    const live = document.getElementById("live");
    if (!live || refreshing) return;
    const active = document.activeElement;
    if (active && live.contains(active) && ["INPUT", "TEXTAREA", "SELECT"].includes(active.tagName)) {
      return; // the operator is typing in it
    }
    refreshing = true;
    try {
      const response = await fetch(location.href, { headers: { "X-Live": "1" }, cache: "no-store" });
      if (response.ok) {
        const html = await response.text();
        const focused = document.activeElement;
        if (!(focused && live.contains(focused) && focused.tagName === "INPUT")) {
          live.innerHTML = html;
          live.dataset.updated = String(Date.now());
        }
      }
    } catch (err) {
      // the dashboard is restarting, or the network is down: try again next time
    } finally {
      refreshing = false;
    }
  }
  setInterval(refresh, REFRESH_MS);

  async function post(url, body) {
    const headers = { "Content-Type": "application/json" };
    const token = csrf();
    if (token) headers["X-CSRF-Token"] = token;
    const response = await fetch(url, {
      method: "POST",
      headers: headers,
      body: JSON.stringify(body),
      credentials: "same-origin",
    });
    let data = {};
    try {
      data = await response.json();
    } catch (err) {
      data = {};
    }
    return [response, data];
  }

  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-schedule-action]");
    if (!button) return;
    event.preventDefault();
    const action = button.dataset.scheduleAction;
    button.disabled = true;
    const [response, data] = await post(
      "/api/schedules/" + encodeURIComponent(button.dataset.name) + "/" + action, {});
    if (response.ok) {
      flash(button.dataset.name + ": " + (data.task_id ? "task " + data.task_id : action + "d"), "ok");
    } else {
      flash(action + " refused (" + response.status + "): " + (data.error || response.statusText), "error");
    }
    button.disabled = false;
    refresh();
  });

  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-send]");
    if (!button) return;
    event.preventDefault();
    const name = document.getElementById("event-name");
    const field = document.getElementById("event-payload");
    const body = { name: name ? name.value : "" };
    try {
      body.payload = JSON.parse(field && field.value ? field.value : "null");
    } catch (err) {
      flash("The payload is not JSON.", "error");
      return;
    }
    button.disabled = true;
    const [response, data] = await post("/api/tasks/" + segment(button.dataset.send) + "/send", body);
    if (response.ok) {
      flash("event " + body.name + " sent" + (data.woke ? ": the task woke" : ""), "ok");
    } else {
      flash("send refused (" + response.status + "): " + (data.error || response.statusText), "error");
    }
    button.disabled = false;
    refresh();
  });

  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-action]");
    if (!button) return;
    event.preventDefault();
    const action = button.dataset.action;
    const task = button.dataset.task;
    if (button.dataset.confirm && !window.confirm(button.dataset.confirm)) return;
    const body = {};
    const reason = document.getElementById("reason");
    if (reason && reason.value) body.reason = reason.value;
    if (action === "skip") {
      body.seq = Number(button.dataset.seq);
      const field = document.getElementById("skip-result-" + button.dataset.seq);
      try {
        body.result = JSON.parse(field && field.value ? field.value : "null");
      } catch (err) {
        flash("The result is not JSON.", "error");
        return;
      }
    }
    button.disabled = true;
    const [response, data] = await post(
      "/api/tasks/" + segment(task) + "/" + action, body);
    if (response.ok) {
      flash(action + ": " + data.outcome.before + " → " + data.outcome.after, "ok");
    } else {
      flash(action + " refused (" + response.status + "): " + (data.error || response.statusText), "error");
    }
    refresh();
  });

  const PLANS = {
    kept: "kept",
    same_key: "run again, same key",
    new_key: "run again, new key",
    undone: "undone first",
  };

  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-redrive]");
    if (!button) return;
    event.preventDefault();
    const kind = button.dataset.redrive;
    const task = button.dataset.task;
    let response;
    let data = {};
    if (kind === "retry-plan") {
      response = await fetch("/api/retry-plan/" + segment(task), {
        credentials: "same-origin",
        cache: "no-store",
      });
      try {
        data = await response.json();
      } catch (err) {
        data = {};
      }
    } else {
      const select = document.getElementById("fork-from");
      const option = select.options[select.selectedIndex];
      const body = { from: option.value, plan: kind === "fork-plan" };
      if (document.getElementById("fork-new-keys").checked) body.new_keys_from = Number(option.dataset.seq);
      const reason = document.getElementById("reason");
      if (reason && reason.value) body.reason = reason.value;
      if (kind === "fork" && button.dataset.confirm && !window.confirm(button.dataset.confirm)) return;
      [response, data] = await post("/api/tasks/" + segment(task) + "/fork", body);
    }
    if (!response.ok) {
      flash(kind + " refused (" + response.status + "): " + (data.error || response.statusText), "error");
      return;
    }
    let head = data.message;
    if (data.action === "fork") head = data.applied ? "forked as " + data.runs_as : "would fork as " + data.runs_as;
    const lines = [head];
    for (const s of data.steps) {
      lines.push("step " + s.seq + (s.position ? " at " + s.position : "") + " " + s.name + ": " +
        (PLANS[s.plan] || s.plan) + " (key " + s.key + ")");
    }
    flashList(lines, data.refused ? "error" : "ok");
    refresh();
  });

  const bulk = document.getElementById("bulk");
  if (bulk) {
    bulk.addEventListener("submit", async (event) => {
      event.preventDefault();
      const form = new FormData(bulk);
      const body = { action: form.get("action"), dry_run: form.get("dry_run") === "on" };
      if (form.get("reason")) body.reason = form.get("reason");
      if (bulk.dataset.listed) {
        body.task_ids = Array.from(document.querySelectorAll("#tasks tr[data-task]"),
          (row) => row.dataset.task);
      } else {
        if (bulk.dataset.state) body.state = bulk.dataset.state;
        if (bulk.dataset.workflow) body.workflow = bulk.dataset.workflow;
      }
      if (!body.dry_run && !window.confirm(body.action + " every task this filter selects?")) return;
      const [response, data] = await post("/api/actions", body);
      if (!response.ok) {
        flash("refused (" + response.status + "): " + (data.error || response.statusText), "error");
        return;
      }
      const lines = [body.dry_run
        ? "Dry run, nothing changed: " + data.applied + " would change, " + data.refused +
          " would be refused, of " + data.outcomes.length
        : data.applied + " changed, " + data.refused + " refused, of " + data.outcomes.length];
      for (const o of data.outcomes.slice(0, 50)) lines.push(o.task_id + ": " + o.message);
      flashList(lines, "ok");
      refresh();
    });
  }
})();
