/**
 * The TypeScript side of the agent contract suite (tests/contract, transport `typescript`):
 * a process that talks JSON lines on its stdin and stdout with the Python test.
 *
 * `node contract.js protocol CONFIG`: each line `{id, agent, route, body}` is one call of the
 * library's protocol module (`AgentProtocol`) for that agent, the body as the route takes
 * it; the answer is `{id, answer}` (as the route answers it), or `{id, error: {status,
 * message}}` (a `StepwardenError`'s).
 *
 * `node contract.js agents CONFIG`: the library's `Agent`, one per agent of CONFIG, each
 * serving its operations with their retry options. Each call is reported to the test
 * (`{id, kind: "call", agent, operation, call, args}`), and the test's answer `{id, value}`
 * or `{id, error: {name, message, permanent}}` is what the operation returns or throws; when
 * the call's signal aborts, `{id, kind: "aborted", reason}` tells the test to stop it. Once
 * every agent is registered it writes `{kind: "registered", instances}`; its log lines are
 * `{kind: "log", level, message}`. On the line
 * `{kind: "stop"}` (or the end of stdin) the agents stop gracefully, and `{kind: "stopped"}`
 * is written before the process exits.
 *
 * CONFIG is JSON: `{url, token}`, and for `agents` also `agents: [{name, operations: {NAME:
 * {retry}}, breaker}]` and `options` (the `AgentOptions` of every agent).
 */

import { createInterface } from "node:readline";

import type { BreakerOptions } from "../src/breaker.js";
import { Agent, type AgentOptions, type OperationOptions, type RetryOptions } from "../src/agent.js";
import { StepwardenError } from "../src/errors.js";
import { AgentProtocol } from "../src/protocol.js";
import type { Json } from "../src/types.js";

interface Config {
  url: string;
  token: string;
  agents?: { name: string; operations: Record<string, { retry?: RetryOptions }>; breaker?: BreakerOptions | null }[];
  options?: Partial<AgentOptions>;
}

type Line = Record<string, any>;

function write(line: Line): void {
  process.stdout.write(JSON.stringify(line) + "\n");
}

function failure(error: unknown): { status: number; message: string } {
  if (error instanceof StepwardenError) return { status: error.status, message: error.message };
  return { status: -1, message: error instanceof Error ? `${error.name}: ${error.message}` : String(error) };
}

async function protocolCall(protocol: AgentProtocol, route: string, body: any): Promise<unknown> {
  switch (route) {
    case "whoami":
      return protocol.whoami();
    case "beat":
      return protocol.beat(body).then(() => null);
    case "leave":
      return protocol.leave(body.instance).then(() => null);
    case "breaker":
      return protocol.breaker(body).then(() => null);
    case "claim":
      return { requests: await protocol.claim(body) };
    case "held":
      return { requests: await protocol.held(body.instance) };
    case "lost":
      return { lost: await protocol.lost(body.instance, body.calls) };
    case "heartbeat": {
      const key = { task_id: body.task_id, seq: body.seq, attempt: body.attempt };
      return { remaining: await protocol.heartbeat(key, body.instance, body.detail ?? null) };
    }
    case "complete":
      return { applied: await protocol.complete(body.items) };
    case "hand-back":
      return { applied: await protocol.handBack(body.items) };
    case "stopped":
      return { applied: await protocol.stopped(body.items) };
    default:
      throw new Error(`no route ${route}`);
  }
}

async function protocolMode(config: Config): Promise<void> {
  const protocols = new Map<string, AgentProtocol>();
  const of = (agent: string): AgentProtocol => {
    let found = protocols.get(agent);
    if (found === undefined) {
      found = new AgentProtocol({ url: config.url, token: config.token, agent });
      protocols.set(agent, found);
    }
    return found;
  };
  const pending = new Set<Promise<void>>();
  for await (const text of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
    if (text.trim() === "") continue;
    const line = JSON.parse(text) as Line;
    const done = protocolCall(of(String(line.agent ?? "")), String(line.route), line.body).then(
      (answer) => write({ id: line.id, answer: answer ?? null }),
      (error: unknown) => write({ id: line.id, error: failure(error) }),
    );
    pending.add(done);
    void done.finally(() => pending.delete(done));
  }
  await Promise.allSettled([...pending]);
}

/** An error as the test's operation raised it: its name and message, and whether the step
 * fails at once (the test's retry policy says so). */
class Raised extends Error {
  readonly permanent: boolean;

  constructor(name: string, message: string, permanent: boolean) {
    super(message);
    this.name = name;
    this.permanent = permanent;
  }
}

async function agentsMode(config: Config): Promise<void> {
  const answers = new Map<number, (line: Line) => void>();
  let next = 0;
  const stop = new AbortController();
  const registered = new Map<string, string>();
  const wanted = config.agents ?? [];
  const agents = wanted.map(({ name, operations, breaker }) => {
    const served: Record<string, OperationOptions> = {};
    for (const [operation, spec] of Object.entries(operations)) {
      served[operation] = {
        retry: { ...spec.retry, isPermanent: (error) => error instanceof Raised && error.permanent },
        fn: async (call, ...args) => {
          const id = ++next;
          const answered = new Promise<Line>((resolve) => answers.set(id, resolve));
          write({
            id,
            kind: "call",
            agent: name,
            operation,
            call: {
              taskId: call.taskId,
              seq: call.seq,
              attempt: call.attempt,
              tryNumber: call.tryNumber,
              idempotencyKey: call.idempotencyKey,
              compensatesKey: call.compensatesKey,
            },
            args: args as Json[],
          });
          // The call must stop: the test's operation is told (an async one is cancelled).
          const onAbort = (): void => write({ id, kind: "aborted", reason: call.cancelled ?? "the call was aborted" });
          if (call.signal.aborted) onAbort();
          else call.signal.addEventListener("abort", onAbort, { once: true });
          const line = await answered;
          call.signal.removeEventListener("abort", onAbort);
          if (line.error) throw new Raised(line.error.name, line.error.message, line.error.permanent === true);
          return line.value as Json;
        },
      };
    }
    return new Agent({
      ...config.options,
      url: config.url,
      token: config.token,
      agent: name,
      operations: served,
      ...(breaker ? { breaker } : {}),
      // Its log, to the test's (as the Python runner's, logger stepwarden.agent).
      logger: {
        debug: () => undefined,
        info: (message) => write({ kind: "log", level: "info", message }),
        warn: (message) => write({ kind: "log", level: "warning", message }),
        error: (message) => write({ kind: "log", level: "error", message }),
      },
      onRegistered: (instance) => {
        registered.set(name, instance);
        if (registered.size === wanted.length) write({ kind: "registered", instances: [...registered.values()] });
      },
    });
  });
  const runs = agents.map((agent) => agent.run(stop.signal));
  const reading = (async () => {
    for await (const text of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
      if (text.trim() === "") continue;
      const line = JSON.parse(text) as Line;
      if (line.kind === "stop") break;
      answers.get(line.id)?.(line);
      answers.delete(line.id);
    }
    stop.abort();
  })();
  const ended = await Promise.allSettled(runs);
  stop.abort();
  for (const outcome of ended) {
    if (outcome.status === "rejected") write({ kind: "failed", error: failure(outcome.reason) });
  }
  write({ kind: "stopped" });
  void reading;
}

const [mode, given] = process.argv.slice(2);
const config = JSON.parse(given ?? "{}") as Config;
if (mode === "protocol") await protocolMode(config);
else if (mode === "agents") await agentsMode(config);
else throw new Error(`the mode is protocol or agents, not ${mode}`);
process.exit(0);
