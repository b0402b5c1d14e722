/**
 * The client and the agent runner against a real server and worker (`stack.ts`): a task
 * submitted by the client runs a step in the Python worker and a step served by the
 * TypeScript agent; its result's long poll; its status messages in order, resumed, also
 * across a restart of the server; an event; a cancel reaching the TypeScript call's signal;
 * retries and a permanent error; the tokens' scopes; a step held but not called; a graceful
 * stop; the example agent stopped by SIGTERM, and the example client.
 */

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { after, before, test } from "node:test";

import {
  Agent,
  AgentProtocol,
  Client,
  PermanentError,
  ResultTimeoutError,
  StepLostError,
  StepwardenError,
  type Call,
  type Logger,
  type StatusMessage,
  type TaskStatus,
} from "../src/index.js";
import { dashboardGet, deferred, type Deferred, AGENT_EXAMPLE, SUBMIT_EXAMPLE, startStack, TIMEOUT, until, type Stack } from "./stack.js";

const CLIENTS = {
  app: ["submit", "read", "events", "cancel", "channels=orders,updates"],
  reader: ["read"],
  shipper: ["agent:shipping"],
  other: ["agent:local"],
};

interface Seen {
  operation: string;
  key: string;
  attempt: number;
  tryNumber: number;
  args: unknown[];
}

interface Registry {
  instances: Array<{ instance: string; agent: string; capacity: number; inflight: number; alive: boolean }>;
}

interface TaskPage {
  events: Array<{ kind: string; detail: Record<string, unknown> }>;
}

let stack: Stack;
let client: Client;
let agent: Agent;
let stopAgent: AbortController;
let running: Promise<void>;
const log: string[] = [];
const seen: Seen[] = [];
/** While set, `ship` waits for it (and says it started). */
let gate: { started: Deferred<void>; open: Deferred<void> } | null = null;
let holding: { started: Deferred<number>; aborted: Deferred<unknown>; after: Deferred<unknown> } | null = null;

const logger: Logger = {
  debug: () => undefined,
  info: (m) => log.push(`info: ${m}`),
  warn: (m) => log.push(`warn: ${m}`),
  error: (m) => log.push(`error: ${m}`),
};

function note(operation: string, call: Call, args: unknown[]): void {
  seen.push({ operation, key: call.idempotencyKey, attempt: call.attempt, tryNumber: call.tryNumber, args });
}

function abortedSignal(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) resolve();
    else signal.addEventListener("abort", () => resolve(), { once: true });
  });
}

function newAgent(token: string): Agent {
  return new Agent({
    url: stack.url,
    token,
    agent: "shipping",
    concurrency: 4,
    heartbeatMs: 200,
    goneAfterMs: 10_000, // a restart of the server is not the instance gone
    pollMs: 500,
    claimWaitMs: 5000,
    drainMs: 15_000,
    retry: { initialMs: 10, maxMs: 50 },
    logger,
    operations: {
      ship: async (call: Call, order: { id: string; n: number }) => {
        note("ship", call, [order]);
        if (gate !== null) {
          gate.started.resolve();
          await gate.open.promise;
        }
        return { tracking: `T-${call.idempotencyKey}`, items: order.n };
      },
      hold: async (call: Call, parcel: string) => {
        note("hold", call, [parcel]);
        const h = holding!;
        h.started.resolve(await call.heartbeat({ parcel, at: "the depot" }));
        await abortedSignal(call.signal);
        h.aborted.resolve(call.signal.reason);
        try {
          await call.heartbeat();
          h.after.resolve(null);
        } catch (error) {
          h.after.resolve(error);
        }
        return { discarded: true };
      },
      wobble: async (call: Call, fails: number) => {
        note("wobble", call, [fails]);
        if (call.tryNumber <= fails) throw new Error(`the courier's line is busy (try ${call.tryNumber})`);
        return { tries: call.tryNumber };
      },
      refuse: async (call: Call, reason: string) => {
        note("refuse", call, [reason]);
        throw new PermanentError(reason);
      },
      stall: async (call: Call, parcel: string) => {
        note("stall", call, [parcel]);
        // Its first call holds the process past complete_by, as a process stopped (SIGSTOP)
        // and continued: no timer fires meanwhile, and it returns once complete_by has passed.
        const until = call.completeBy.getTime() + 200;
        if (call.attempt === 1) while (Date.now() < until) { /* the process stands still */ }
        return { parcel, attempt: call.attempt };
      },
    },
  });
}

async function result(taskId: string): Promise<Awaited<ReturnType<Client["result"]>>> {
  try {
    return await client.result(taskId, { timeoutMs: TIMEOUT });
  } catch (error) {
    throw new Error(`no result for ${taskId}: ${String(error)}\n${log.join("\n")}\n${stack.logs()}`);
  }
}

before(async () => {
  stack = await startStack(CLIENTS);
  client = new Client({ url: stack.url, token: stack.tokens.app! });
  stopAgent = new AbortController();
  agent = newAgent(stack.tokens.shipper!);
  running = agent.run(stopAgent.signal);
});

after(async () => {
  stopAgent?.abort();
  await running?.catch(() => undefined);
  await stack?.stop();
});

test("a task submitted by the client finishes, its step served by the TypeScript agent", async () => {
  const order = { id: "o-1", n: 21 };
  const made = await client.submit("order", order, { taskId: "order-1", priority: 5 });
  assert.deepEqual([made.taskId, made.created], ["order-1", true]);
  // Submitted again (its answer lost, say): the same task.
  const again = await client.submit("order", order, { taskId: "order-1", priority: 5 });
  assert.deepEqual([again.taskId, again.created], ["order-1", false]);
  // Its handle waits for its outcome, as the client does.
  const done = await made.result({ timeoutMs: TIMEOUT });
  assert.equal(done.taskId, "order-1");
  assert.ok(done.finishedAt instanceof Date);
  assert.equal(done.state, "processed");
  assert.deepEqual(done.result, { doubled: 42, shipped: { tracking: "T-order-1/2", items: 42 } });
  assert.deepEqual(
    seen.filter((s) => s.key.startsWith("order-1/")),
    [{ operation: "ship", key: "order-1/2", attempt: 1, tryNumber: 1, args: [{ id: "o-1", n: 42 }] }],
  );
  const status = await client.status("order-1");
  assert.equal(status.state, "processed");
  assert.equal(status.finished, true);
  assert.equal(status.priority, 5);
  assert.equal(status.taskId, "order-1");
  assert.equal(status.replyTo, null);
  assert.ok(status.createdAt instanceof Date && status.createdAt <= status.updatedAt);
  const registry = await dashboardGet<Registry>(stack, "/api/agents");
  const mine = registry.instances.find((i) => i.instance === agent.instance);
  assert.ok(mine?.alive && mine.agent === "shipping" && mine.capacity === 4, JSON.stringify(registry));
  assert.ok(agent.instance?.startsWith("shipper/"));
});

test("the result's long poll waits for the task, up to a timeout of the caller's", async () => {
  await client.submit("order", { id: "later", n: 1 }, { taskId: "later-1", startAfterMs: 3_600_000 });
  const began = performance.now();
  await assert.rejects(client.result("later-1", { timeoutMs: 300 }), (error: unknown) => {
    assert.ok(error instanceof ResultTimeoutError);
    assert.equal(error.status, 202);
    assert.equal((error.taskStatus as TaskStatus).state, "waiting");
    assert.ok((error.taskStatus as TaskStatus).wakeAt instanceof Date);
    return true;
  });
  assert.ok(performance.now() - began >= 300);
  await assert.rejects(client.result("later-1", { timeoutMs: 0 }), ResultTimeoutError);

  // Asked before the task finishes: answered when it does.
  gate = { started: deferred(), open: deferred() };
  await client.submit("order", { id: "o-2", n: 2 }, { taskId: "order-2" });
  const waiting = client.result("order-2", { timeoutMs: TIMEOUT });
  await gate.started.promise;
  assert.equal((await client.status("order-2")).finished, false);
  gate.open.resolve();
  gate = null;
  const done = await waiting;
  assert.deepEqual(done.result, { doubled: 4, shipped: { tracking: "T-order-2/2", items: 4 } });

  await assert.rejects(client.result("no-such-task", { timeoutMs: 1000 }), (error: unknown) => {
    assert.ok(error instanceof StepwardenError);
    assert.equal(error.status, 404);
    return true;
  });
});

test("the status messages stream in order as they come, and resume after an id", async () => {
  gate = { started: deferred(), open: deferred() };
  await client.submit("order", { id: "o-3", n: 3 }, { taskId: "order-3", replyTo: "orders" });
  const followed: StatusMessage[] = [];
  const first = deferred<void>();
  const following = (async () => {
    for await (const message of client.messages("order-3")) {
      followed.push(message);
      first.resolve();
    }
  })();
  await first.promise;
  await gate.started.promise; // the stream is open while the shipping step runs
  gate.open.resolve();
  gate = null;
  await following; // it ends by itself once the task has finished
  assert.deepEqual(
    followed.map((m) => m.kind),
    ["received", "step_completed", "step_completed", "processed"],
  );
  const ids = followed.map((m) => m.id);
  assert.deepEqual([...ids].sort((a, b) => a - b), ids);
  assert.equal(new Set(ids).size, ids.length);
  assert.ok(followed.every((m) => m.taskId === "order-3"));

  const rest: StatusMessage[] = [];
  for await (const message of client.messages("order-3", { lastEventId: ids[1]! })) rest.push(message);
  assert.deepEqual(rest, followed.slice(2));
  const none: StatusMessage[] = [];
  for await (const message of client.messages("order-3", { lastEventId: ids.at(-1)! })) none.push(message);
  assert.deepEqual(none, []);

  // A task without reply_to has no status messages.
  const stream = client.messages("order-1");
  await assert.rejects(stream.next(), (error: unknown) => error instanceof StepwardenError && error.status === 409);
});

test("across a restart of the server, the stream resumes after the last message and the long poll goes on", async () => {
  gate = { started: deferred(), open: deferred() };
  await client.submit("order", { id: "o-r", n: 5 }, { taskId: "restarted", replyTo: "orders" });
  const followed: StatusMessage[] = [];
  const first = deferred<void>();
  const following = (async () => {
    for await (const message of client.messages("restarted")) {
      followed.push(message);
      first.resolve();
    }
  })();
  const waiting = client.result("restarted", { timeoutMs: TIMEOUT });
  await first.promise;
  await gate.started.promise;
  const before = followed.length;
  await stack.restartDashboard(); // its stream ends, its long poll answers 202; then refused
  gate.open.resolve();
  gate = null;
  const done = await waiting;
  await following;
  assert.equal(done.state, "processed");
  assert.ok(before >= 1 && before < followed.length, `${before} of ${followed.length} before the restart`);
  assert.deepEqual(
    followed.map((m) => m.kind),
    ["received", "step_completed", "step_completed", "processed"],
  );
  const ids = followed.map((m) => m.id);
  assert.deepEqual([...ids].sort((a, b) => a - b), ids);
  assert.equal(new Set(ids).size, ids.length);
});

test("an event sent to a task that waits for it wakes it, once per event id", async () => {
  await client.submit("approved", { id: "o-e", n: 2 }, { taskId: "approval-1" });
  await until("the task to wait for its approval", async () => {
    return (await client.status("approval-1")).waitingFor === "event:approve";
  });
  gate = { started: deferred(), open: deferred() };
  assert.deepEqual(await client.sendEvent("approval-1", "approve", "ann", "approval-1-ann"), { sent: true, woke: true });
  await gate.started.promise; // approved: it ships (until the gate opens)
  // Sent again (its answer lost, say): kept once.
  assert.deepEqual(await client.sendEvent("approval-1", "approve", "ann", "approval-1-ann"), { sent: false, woke: false });
  gate.open.resolve();
  gate = null;
  const done = await result("approval-1");
  assert.deepEqual(done.result, { approved_by: "ann", shipped: { tracking: "T-approval-1/2", items: 2 } });
  // Sent again once it finished the task: answered as sent before, not refused.
  assert.deepEqual(await client.sendEvent("approval-1", "approve", "ann", "approval-1-ann"), { sent: false, woke: false });
  // A finished task takes no other event, and cannot be cancelled.
  for (const refused of [() => client.sendEvent("approval-1", "approve", "bob"), () => client.cancel("approval-1")]) {
    await assert.rejects(refused(), (error: unknown) => error instanceof StepwardenError && error.status === 409);
  }
});

test("a cancel aborts the TypeScript call's signal, and the call's stop is recorded", async () => {
  holding = { started: deferred(), aborted: deferred(), after: deferred() };
  const haul = await client.submit("haul", "parcel-1", { taskId: "haul-1" });
  const remaining = await holding.started.promise;
  assert.ok(remaining > 25_000 && remaining <= 30_000, `a heartbeat gave ${remaining} ms`);
  // Its handle cancels it.
  const cancelled = await haul.cancel("the customer changed their mind");
  assert.deepEqual([cancelled.taskId, cancelled.applied, cancelled.after], ["haul-1", true, "cancelled"]);
  const reason = await holding.aborted.promise;
  assert.ok(reason instanceof StepLostError, String(reason));
  assert.equal(reason.why, "the task is cancelled");
  const after = await holding.after.promise;
  assert.ok(after instanceof StepLostError, "a heartbeat after the cancel throws");
  const done = await result("haul-1");
  assert.equal(done.state, "cancelled");
  const stopped = await until("the call's stop to be recorded", async () => {
    const page = await dashboardGet<TaskPage>(stack, "/api/tasks/haul-1");
    return page.events.find((e) => e.kind === "call_stopped");
  });
  assert.equal(stopped.detail.from, agent.instance);
  assert.equal(stopped.detail.reason, "the task is cancelled");
  holding = null;
});

test("a call that throws is tried again; a PermanentError fails the step at once", async () => {
  await client.submit("flaky", 2, { taskId: "flaky-1" });
  const done = await result("flaky-1");
  assert.equal(done.state, "processed");
  assert.deepEqual(done.result, { tries: 3 });
  assert.deepEqual(
    seen.filter((s) => s.key === "flaky-1/1").map((s) => [s.attempt, s.tryNumber]),
    [[1, 1], [1, 2], [1, 3]],
  );

  await client.submit("refused", "no courier goes there", { taskId: "refused-1" });
  const failed = await result("refused-1");
  assert.equal(failed.state, "error");
  assert.match(failed.error ?? "", /PermanentError: no courier goes there/);
  assert.equal(seen.filter((s) => s.key === "refused-1/1").length, 1);
});

test("a call that returns past its complete_by reports nothing, and is not asked about", async () => {
  await client.submit("stalled", "crate", { taskId: "stalled-1" });
  const done = await result("stalled-1");
  assert.deepEqual(done.result, { parcel: "crate", attempt: 2 }); // dispatched again
  const lines = log.filter((line) => line.includes("stalled-1"));
  assert.ok(lines.includes("info: shipping.stall for stalled-1/1: complete_by passed, stopping"), lines.join("\n"));
  // Not reported late (and refused), nor aborted after it had returned.
  assert.ok(!lines.some((line) => /late outcome|aborting the call|stopped \(/.test(line)), lines.join("\n"));
});

test("a token serves only its agents: another agent's token cannot claim (403)", async () => {
  const other = new AgentProtocol({ url: stack.url, token: stack.tokens.other!, agent: "shipping" });
  await assert.rejects(
    other.claim({ instance: "other/x", operations: ["ship"], limit: 1 }),
    (error: unknown) => {
      assert.ok(error instanceof StepwardenError);
      assert.equal(error.status, 403);
      assert.match(error.message, /agent:shipping/);
      return true;
    },
  );
  // Its own client's instances only.
  const shipper = new AgentProtocol({ url: stack.url, token: stack.tokens.shipper!, agent: "shipping" });
  await assert.rejects(
    shipper.claim({ instance: "other/x", operations: ["ship"], limit: 1 }),
    (error: unknown) => error instanceof StepwardenError && error.status === 403 && /CLIENT\//.test(error.message),
  );
  // An agent runner with that token does not start.
  await assert.rejects(newAgent(stack.tokens.other!).run(), (error: unknown) => {
    assert.ok(error instanceof StepwardenError);
    assert.equal(error.status, 403);
    assert.match(error.message, /agent:shipping/);
    return true;
  });
  // The application API's scopes, and a wrong token.
  const reader = new Client({ url: stack.url, token: stack.tokens.reader! });
  await assert.rejects(reader.submit("order", { id: "x", n: 1 }), (error: unknown) => {
    assert.ok(error instanceof StepwardenError);
    assert.equal(error.status, 403);
    assert.match(error.message, /submit/);
    return true;
  });
  const stranger = new Client({ url: stack.url, token: "sw_not-a-token-of-this-server" });
  await assert.rejects(stranger.status("order-1"), (error: unknown) => error instanceof StepwardenError && error.status === 401);
  // An invalid request: the server's message says what is wrong.
  await assert.rejects(client.submit("no_such_workflow", 1), (error: unknown) => {
    assert.ok(error instanceof StepwardenError);
    assert.equal(error.status, 422);
    assert.match(error.message, /order/);
    return true;
  });
});

/** Submit `count` orders and wait until their shipping calls are under way (the gate shut). */
async function shipping(prefix: string, count: number): Promise<string[]> {
  const ids = Array.from({ length: count }, (_, i) => `${prefix}-${i + 1}`);
  for (const id of ids) await client.submit("order", { id, n: 1 }, { taskId: id });
  await until(`${count} calls of ${prefix} under way`, () =>
    ids.every((id) => seen.some((s) => s.key === `${id}/2`)),
  );
  return ids;
}

interface StepRow {
  seq: number;
  state: string;
  attempt: number;
  locked_by: string | null;
}

async function shippingStep(taskId: string): Promise<StepRow | undefined> {
  const page = await dashboardGet<{ steps: StepRow[] }>(stack, `/api/tasks/${taskId}`);
  return page.steps.find((s) => s.seq === 2);
}

/** Until the shipping step of `taskId` is held by `instance`: claimed as that instance would
 * claim it, its answer kept from the runner (as if it had been lost), unless a claim of the
 * instance's own took it first. */
async function heldBy(instance: string, taskId: string): Promise<void> {
  const protocol = new AgentProtocol({ url: stack.url, token: stack.tokens.shipper!, agent: "shipping" });
  await until(`the shipping step of ${taskId} held by ${instance}`, async () => {
    const step = await shippingStep(taskId);
    if (step?.state === "running") return step.locked_by === instance;
    if (step?.state === "not_started") {
      const claimed = await protocol.claim({ instance, operations: ["ship"], limit: 1 });
      assert.deepEqual(claimed.map((r) => r.task_id), claimed.length > 0 ? [taskId] : []);
    }
    return false;
  });
}

test("a step the instance holds but does not call (its claim's answer lost) is called", async () => {
  gate = { started: deferred(), open: deferred() };
  const busy = await shipping("busy", agent.concurrency); // no room: it claims nothing more
  await client.submit("order", { id: "lost-answer", n: 1 }, { taskId: "lost-answer" });
  await heldBy(agent.instance!, "lost-answer");
  await until("the held step to be called", () => seen.some((s) => s.key === "lost-answer/2"));
  gate.open.resolve();
  gate = null;
  for (const id of [...busy, "lost-answer"]) assert.equal((await result(id)).state, "processed");
  assert.deepEqual(
    seen.filter((s) => s.key === "lost-answer/2").map((s) => [s.attempt, s.tryNumber]),
    [[1, 1]],
  );
});

test("stopping, the agent claims no more, lets its calls finish, hands back the rest, and leaves", async () => {
  gate = { started: deferred(), open: deferred() };
  const draining = await shipping("drain", agent.concurrency - 1);
  stopAgent.abort();
  // Stopping, it says it has no room but for the calls under way.
  await until("the stopping agent's capacity to shrink", async () => {
    const registry = await dashboardGet<Registry>(stack, "/api/agents");
    const mine = registry.instances.find((i) => i.instance === agent.instance);
    return mine !== undefined && mine.alive && mine.capacity === draining.length;
  });
  // A request claimed for it now (a long poll it gave up, answered late) is not called, but
  // handed back.
  await client.submit("order", { id: "handed-back", n: 1 }, { taskId: "handed-back" });
  await heldBy(agent.instance!, "handed-back");
  gate.open.resolve();
  gate = null;
  await running;
  for (const id of draining) assert.equal((await result(id)).state, "processed");
  assert.ok(!seen.some((s) => s.key === "handed-back/2"));
  const step = await shippingStep("handed-back");
  assert.ok(step?.state === "not_started" && step.attempt === 1, JSON.stringify(step));
  const registry = await dashboardGet<Registry>(stack, "/api/agents");
  const mine = registry.instances.find((i) => i.instance === agent.instance);
  assert.ok(mine !== undefined && !mine.alive, JSON.stringify(mine));
  assert.deepEqual(log.filter((line) => line.startsWith("error")), []);
});

test("the examples: an agent serves shipping until SIGTERM, then stops gracefully; a client submits", async () => {
  const example = spawn(process.execPath, [AGENT_EXAMPLE], {
    env: { ...process.env, STEPWARDEN_URL: stack.url, STEPWARDEN_AGENT_TOKEN: stack.tokens.shipper! },
    stdio: ["ignore", "pipe", "inherit"],
  });
  const exited = new Promise<number | null>((resolve) => example.once("exit", (code) => resolve(code)));
  try {
    const lines = createInterface({ input: example.stdout! });
    const instance = await new Promise<string>((resolve, reject) => {
      lines.on("line", (line) => {
        const found = /serving shipping as (\S+)/.exec(line);
        if (found) resolve(found[1]!);
      });
      void exited.then((code) => reject(new Error(`the example ended (${code})`)));
    });
    // The example client submits an order, follows its messages, prints its result.
    const submitted = await new Promise<{ code: number | null; out: string }>((resolve) => {
      const submit = spawn(process.execPath, [SUBMIT_EXAMPLE, "order", '{"id": "o-5", "n": 5}', "order-5"], {
        env: { ...process.env, STEPWARDEN_URL: stack.url, STEPWARDEN_TOKEN: stack.tokens.app! },
        stdio: ["ignore", "pipe", "inherit"],
      });
      let out = "";
      submit.stdout!.on("data", (chunk: Buffer) => (out += chunk.toString()));
      submit.once("close", (code) => resolve({ code, out }));
    });
    assert.equal(submitted.code, 0, submitted.out);
    const printed = submitted.out.trim().split("\n");
    assert.equal(printed[0], "submitted order-5");
    assert.deepEqual(
      printed.slice(1, -1).map((line) => line.split(" ")[1]),
      ["received", "step_completed", "step_completed", "processed"],
    );
    assert.match(printed.at(-1)!, /^processed: .*"tracking":"T-order-5\/2"/);
    const done = await result("order-5");
    assert.equal(done.state, "processed");
    const shipped = (done.result as { shipped: { tracking: string } }).shipped;
    assert.equal(shipped.tracking, "T-order-5/2");
    // The step handed back by the stopped agent, the same attempt, served by this one.
    assert.equal((await result("handed-back")).state, "processed");
    example.kill("SIGTERM");
    assert.equal(await exited, 0);
    const registry = await dashboardGet<Registry>(stack, "/api/agents");
    const gone = registry.instances.find((i) => i.instance === instance);
    assert.ok(gone !== undefined && !gone.alive, JSON.stringify(gone));
  } finally {
    if (example.exitCode === null) example.kill("SIGKILL");
  }
});
