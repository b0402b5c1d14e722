/**
 * An agent served from this process over the agent protocol: `new Agent({...}).run(signal)`
 * claims the requests of one agent from a stepwarden server and calls its operations.
 *
 * As the Python runner does, it registers its instance and beats every `heartbeatMs`
 * (its operations, capacity and calls in flight); claims as many requests as it has free
 * slots (a long poll); calls each operation with a `Call` (the step's idempotency key, its
 * deadline, a signal aborted when the step is no longer the call's) and retries a call that
 * throws, with backoff and jitter, while the step's complete_by allows (a `PermanentError`
 * fails the step at once); reports each outcome with the claim's fencing token (task_id,
 * seq, attempt, instance), the outcomes that come while a write is under way in the next
 * one. When complete_by passes, it stops and reports nothing: the supervisor dispatches the
 * step again. Its retry defaults and bounds are the server's (`whoami`), and the server
 * keeps the start of a long error. With a `breaker`, consecutive transient failures open
 * it: it hands back the request, claims nothing and calls nothing while it is open, then
 * lets trial calls through (half-open), as the Python runner's does.
 *
 * Every `pollMs`, and at once when the wake-up stream names the task of a call in
 * flight, it asks which calls no longer hold their step (their task cancelled, paused or
 * compensating, the step reassigned...) and aborts their signal; once such a call has ended,
 * it tells the server (`stopped`), so that a compensation waiting for it may start. At each
 * beat it asks which steps it holds and calls those it is not calling (a claim whose answer
 * was lost leaves them so).
 *
 * On stop (the signal given to `run`), it claims no more, hands back the requests it claimed
 * and has not started, lets the calls under way finish for up to `drainMs` (then aborts
 * them, reporting nothing: their steps go to another instance), and leaves the registry.
 */

import { randomBytes } from "node:crypto";

import { Batcher } from "./batch.js";
import { CircuitBreaker, type BreakerOptions, type BreakerState } from "./breaker.js";
import { ConfigurationError, PermanentError, StepLostError, StepwardenError } from "./errors.js";
import { describe as describeError, type ServerOptions } from "./http.js";
import { AgentProtocol } from "./protocol.js";
import { Flag, pause, sleep } from "./timing.js";
import type { CallKey, ClaimedRequest, Handback, Json, OperationLimit, Outcome, WhoAmI } from "./types.js";

/** An operation: called with its `Call` and the arguments the workflow's step gave. */
export type OperationFunction = (call: Call, ...args: any[]) => unknown;

export interface RetryOptions {
  /** Calls within one dispatch of a step, 1 meaning no retry. */
  maxAttempts?: number;
  /** Milliseconds before the second call, growing by `multiplier` up to `maxMs`; with
   * `jitter`, a random part of that. What is left out is the server's default
   * (`stepwarden.Retry()`'s, which its `whoami` answers: 5 calls, 0.1 s growing by 2 up
   * to 5 s, with jitter), and the policy must stay within its bounds. */
  initialMs?: number;
  maxMs?: number;
  multiplier?: number;
  jitter?: boolean;
  /** Errors never retried, besides `PermanentError`: the step fails at once. */
  isPermanent?: (error: unknown) => boolean;
}

export interface OperationLimitOptions {
  /** Steps of the operation running at once across every instance. */
  concurrency?: number;
  /** Steps started per `perMs` milliseconds (default 1000) across every instance. */
  rate?: number;
  perMs?: number;
  /** Steps of the operation running at once in this instance. */
  perInstance?: number;
}

export interface OperationOptions {
  fn: OperationFunction;
  retry?: RetryOptions;
  limit?: OperationLimitOptions;
}

export interface Logger {
  debug(message: string): void;
  info(message: string): void;
  warn(message: string): void;
  error(message: string): void;
}

export interface AgentOptions extends ServerOptions {
  /** The agent served: one the application declares, and the token's scopes name
   * (`agent:NAME`). */
  agent: string;
  /** Its operations, by name: a function, or one with its retry policy and limit. */
  operations: Record<string, OperationFunction | OperationOptions>;
  /** Calls made at once (default 10). */
  concurrency?: number;
  /** Milliseconds between the instance's beats in the registry (default 1000). */
  heartbeatMs?: number;
  /** Milliseconds without a beat after which the instance is gone and its steps go to
   * another (default 5000; within the server's bounds, 1000 to 3600000). */
  goneAfterMs?: number;
  /** Milliseconds between two checks of the calls in flight (default 1000). */
  pollMs?: number;
  /** Milliseconds a claim waits for a request when none is queued (a long poll; default
   * 10000, at most the server's bound, 30000). */
  claimWaitMs?: number;
  /** Milliseconds given to the calls under way when the agent stops (default 30000). */
  drainMs?: number;
  /** The operations' retry policy (each may have its own). */
  retry?: RetryOptions;
  /** A circuit breaker for the instance (none by default): what is left out is the server's
   * default (`stepwarden.Breaker()`'s). */
  breaker?: BreakerOptions;
  /** The instance's name after `CLIENT/` (default `agent-` and 16 random hex digits). */
  instance?: string;
  /** Where it logs (default: warnings and errors to the console; null: nowhere). */
  logger?: Logger | null;
  /** Called once the instance is registered, with its name (`CLIENT/...`): it claims from
   * then on. */
  onRegistered?: (instance: string) => void;
}

/** What an operation knows of the call it serves. */
export class Call {
  readonly taskId: string;
  /** The step's number in its task. */
  readonly seq: number;
  /** How many times the step has been dispatched (1 on the first dispatch). */
  readonly attempt: number;
  /** Calls made so far within this dispatch, this one included. */
  readonly tryNumber: number;
  /** The same for every retry and dispatch of the step: pass it to the remote service. */
  readonly idempotencyKey: string;
  readonly agent: string;
  readonly operation: string;
  readonly workflow: string | null;
  /** On a compensation: the idempotency key of the step it undoes. */
  readonly compensatesKey: string | null;
  /**
   * Aborted when the call must stop: the step is no longer its own (the reason is a
   * `StepLostError` saying why), its complete_by passed (a `TimeoutError`), or the agent
   * stops and the drain is over (an `AbortError`). Pass it to what the call waits for
   * (`fetch(url, {signal: call.signal})`). What the operation returns after it is
   * discarded.
   */
  readonly signal: AbortSignal;
  readonly #hold: Hold;
  readonly #beat: (detail: Json) => Promise<number>;

  /** @internal */
  constructor(hold: Hold, tryNumber: number, beat: (detail: Json) => Promise<number>) {
    const r = hold.request;
    this.taskId = r.task_id;
    this.seq = r.seq;
    this.attempt = r.attempt;
    this.tryNumber = tryNumber;
    this.idempotencyKey = r.idempotency_key;
    this.agent = r.agent;
    this.operation = r.operation;
    this.workflow = r.workflow ?? null;
    this.compensatesKey = r.compensates == null ? null : `${r.task_id}/${r.compensates}`;
    this.signal = hold.controller.signal;
    this.#hold = hold;
    this.#beat = beat;
  }

  /** When this call must be done; a heartbeat moves it on. */
  get completeBy(): Date {
    return new Date(Date.now() + this.#hold.remainingMs());
  }

  /** Milliseconds left before complete_by. */
  remainingMs(): number {
    return Math.max(0, this.#hold.remainingMs());
  }

  /** Why the step is no longer this call's (null while it is). */
  get cancelled(): string | null {
    return this.#hold.cancelled;
  }

  /**
   * Tell the server this call is alive: the step's complete_by moves to now + its
   * complete_within (never past the task's), and `detail` (JSON) is recorded with the
   * step. The milliseconds now left. Throws `StepLostError` when the step is no longer this
   * call's (and aborts `signal`): stop then. A heartbeat the server did not answer changes
   * nothing (the step keeps its complete_by).
   */
  heartbeat(detail?: unknown): Promise<number> {
    return this.#beat((detail ?? null) as Json);
  }

  toString(): string {
    return `<Call ${this.idempotencyKey} attempt=${this.attempt} try=${this.tryNumber}>`;
  }
}

const MAX_TIMER = 2 ** 31 - 1;
const STOPPING = "the agent instance is stopping";

type Ending = "lost" | "expired" | "gone" | "stopping";

/** The runner's hold of one claimed step: its deadline, moved on by heartbeats, and how
 * the call's hold of it ended, once it has. */
class Hold {
  readonly request: ClaimedRequest;
  readonly key: string;
  readonly controller = new AbortController();
  /** When complete_by passes, by `performance.now()`. */
  deadline: number;
  /** Why the step is no longer the call's, as the server said. */
  cancelled: string | null = null;
  /** How the call's hold ended (undefined while it holds the step). */
  ending: Ending | undefined;
  /** Its outcome is being recorded: whether the step is still held says nothing of the call. */
  answered = false;
  /** The agent stopped and the drain is over: nothing more is written about the call. */
  abandoned = false;
  /** Handed back (its breaker opened): another instance, or this one later, calls it. */
  handedBack = false;
  /** Resolves when waiting for the call to end is pointless: complete_by passed, or the
   * agent stops. */
  readonly over: Promise<void>;
  #over!: () => void;
  #timer: ReturnType<typeof setTimeout> | undefined;

  constructor(request: ClaimedRequest) {
    this.request = request;
    this.key = keyOf(request);
    this.deadline = performance.now() + Math.max(0, request.remaining) * 1000;
    this.over = new Promise((resolve) => (this.#over = resolve));
    this.#schedule();
  }

  remainingMs(): number {
    return this.deadline - performance.now();
  }

  passesWithin(ms: number): boolean {
    return performance.now() + ms >= this.deadline;
  }

  /** A heartbeat said how many seconds are left. */
  moveTo(seconds: number): void {
    this.deadline = performance.now() + Math.max(0, seconds) * 1000;
    this.#schedule();
  }

  #schedule(): void {
    clearTimeout(this.#timer);
    const wait = Math.min(MAX_TIMER, Math.max(0, this.remainingMs()));
    this.#timer = setTimeout(() => {
      if (this.remainingMs() > 0) this.#schedule();
      else this.#end("expired", new DOMException("complete_by passed", "TimeoutError"));
    }, wait);
  }

  /** Whether complete_by has passed, by this clock: then the hold ends as expired, though its
   * timer has not fired yet (the process was stopped past it, say, and runs again). */
  expireIfPast(): boolean {
    if (this.ending === undefined && this.remainingMs() <= 0) {
      this.#end("expired", new DOMException("complete_by passed", "TimeoutError"));
    }
    return this.ending === "expired";
  }

  /** The step is no longer the call's: the server said why (a stop is reported once the
   * call has ended). */
  lose(why: string): void {
    if (this.cancelled === null && this.ending === undefined) this.cancelled = why;
    this.#end("lost", new StepLostError(why));
  }

  /** The step is no longer the call's, and nothing is to be reported. */
  forsake(why: string): void {
    this.#end("gone", new StepLostError(why));
  }

  /** The agent stops and the drain is over: nothing more is reported. */
  abandon(): void {
    this.abandoned = true;
    this.#end("stopping", new DOMException(STOPPING, "AbortError"));
    this.#over();
  }

  #end(ending: Ending, reason: unknown): void {
    if (ending === "expired") this.#over();
    if (this.ending !== undefined) return;
    this.ending = ending;
    this.controller.abort(reason);
  }

  dispose(): void {
    clearTimeout(this.#timer);
  }
}

function keyOf(k: CallKey): string {
  return `${k.task_id}\u0000${k.seq}\u0000${k.attempt}`;
}

function callKey(r: CallKey): CallKey {
  return { task_id: r.task_id, seq: r.seq, attempt: r.attempt };
}

type Policy = Required<Omit<RetryOptions, "isPermanent">> & { isPermanent?: (error: unknown) => boolean };

interface Op {
  name: string;
  fn: OperationFunction;
  /** The retry options given (the agent's, then the operation's own): over the server's
   * defaults, the operation's policy once `run` has asked the server. */
  retry: RetryOptions;
  limit: OperationLimitOptions | undefined;
}

type Settled = { kind: "value"; value: unknown } | { kind: "error"; error: unknown } | { kind: "aborted" };

/** The promise's outcome, or "aborted" as soon as `signal` aborts (the promise then runs on,
 * its outcome ignored). */
function settle(promise: Promise<unknown>, signal: AbortSignal): Promise<Settled> {
  return new Promise((resolve) => {
    const onAbort = (): void => resolve({ kind: "aborted" });
    promise.then(
      (value) => {
        signal.removeEventListener("abort", onAbort);
        resolve({ kind: "value", value });
      },
      (error: unknown) => {
        signal.removeEventListener("abort", onAbort);
        resolve({ kind: "error", error });
      },
    );
    if (signal.aborted) onAbort();
    else signal.addEventListener("abort", onAbort, { once: true });
  });
}

function positive(name: string, value: number | undefined, fallback: number, max = Infinity): number {
  if (value === undefined) return fallback;
  if (typeof value !== "number" || !Number.isFinite(value) || value <= 0 || value > max) {
    throw new ConfigurationError(`${name} must be a number in (0, ${max}], not ${String(value)}`);
  }
  return value;
}

/** The options given, each checked alone (their bounds are the server's: `policyOf`). */
function retryOptions(given: RetryOptions | undefined): RetryOptions {
  const options = { ...given };
  for (const [name, value] of Object.entries(options)) {
    if (value === undefined) delete options[name as keyof RetryOptions];
  }
  const { maxAttempts, initialMs, maxMs, multiplier } = options;
  if (maxAttempts !== undefined && (!Number.isInteger(maxAttempts) || maxAttempts < 1)) {
    throw new ConfigurationError(`retry.maxAttempts must be an integer of 1 or more, not ${maxAttempts}`);
  }
  for (const [name, value] of Object.entries({ initialMs, maxMs, multiplier })) {
    if (value !== undefined && (typeof value !== "number" || !Number.isFinite(value) || value < 0)) {
      throw new ConfigurationError(`retry.${name} must be a finite number of 0 or more, not ${String(value)}`);
    }
  }
  return options;
}

/** The retry policy of the options given over the server's defaults, within its bounds. */
function policyOf(given: RetryOptions, me: WhoAmI): Policy {
  const served = me.retry;
  const policy: Policy = {
    maxAttempts: served.max_attempts,
    initialMs: served.initial * 1000,
    maxMs: served.maximum * 1000,
    multiplier: served.multiplier,
    jitter: served.jitter,
    ...given,
  };
  const maxDelay = me.retry_bounds.max_delay * 1000;
  if (!(policy.initialMs <= policy.maxMs && policy.maxMs <= maxDelay && policy.multiplier >= 1)) {
    throw new ConfigurationError(
      `retry needs 0 <= initialMs <= maxMs <= ${maxDelay} and multiplier >= 1, not ` +
        `initialMs ${policy.initialMs}, maxMs ${policy.maxMs}, multiplier ${policy.multiplier}`,
    );
  }
  return policy;
}

function consoleLogger(agent: string): Logger {
  const prefix = `stepwarden agent ${agent}:`;
  return {
    debug: () => undefined,
    info: () => undefined,
    warn: (message) => console.warn(prefix, message),
    error: (message) => console.error(prefix, message),
  };
}

const SILENT: Logger = { debug: () => undefined, info: () => undefined, warn: () => undefined, error: () => undefined };

/** The error text of a failed step: the error's name and message (the server cuts a long
 * one as it stores it). */
function errorText(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}` : `Error: ${String(error)}`;
}

/** Milliseconds to wait after the `failures`-th failure in a row of a call to the server. */
function backoffMs(failures: number, initial = 200, maximum = 10_000): number {
  const ceiling = Math.min(maximum, initial * 2 ** Math.min(failures - 1, 20));
  return ceiling / 2 + (Math.random() * ceiling) / 2;
}

/** An agent served from this process (see the module's description). */
export class Agent {
  /** The agent's name. */
  readonly name: string;
  readonly concurrency: number;
  readonly #protocol: AgentProtocol;
  readonly #ops = new Map<string, Op>();
  readonly #heartbeat: number;
  readonly #goneAfter: number;
  readonly #poll: number;
  readonly #claimWait: number;
  readonly #drain: number;
  readonly #suffix: string;
  readonly #log: Logger;
  readonly #onRegistered: ((instance: string) => void) | undefined;
  #instance: string | null = null;
  readonly #holds = new Map<string, Hold>();
  /** Calls that ended, by key, while the server may still show their step held by this
   * instance (out of tries or time): never taken up again, until their complete_by. */
  readonly #ended = new Map<string, number>();
  readonly #serving = new Set<Promise<void>>();
  readonly #writes = new Set<Promise<unknown>>();
  readonly #running = new Map<string, number>();
  readonly #room = new Flag();
  readonly #queued = new Flag();
  readonly #checkNow = new Flag();
  #stopping = false;
  #active = false;
  readonly #breakerGiven: BreakerOptions | undefined;
  #breaker: CircuitBreaker | null = null;
  /** The outcomes and the stops of calls, each written with those that come meanwhile. */
  readonly #completions = new Batcher<Outcome, boolean>((items) => this.#protocol.complete(items), 1000);
  readonly #stops = new Batcher<Handback, boolean>((items) => this.#protocol.stopped(items), 1000);
  /** The claim under way (its long poll is given up when the breaker opens). */
  #claim: AbortController | null = null;
  /** The breaker's transitions not yet recorded as events of the history. */
  readonly #transitions: BreakerState[] = [];
  readonly #policies = new Map<string, Policy>();
  /** The highest power of a retry's multiplier, and the characters of an error the server
   * keeps: the server's bounds, set by `run`. */
  #maxExponent = 0;
  #maxError = Infinity;

  constructor(options: AgentOptions) {
    if (!options || typeof options.agent !== "string" || options.agent === "") {
      throw new ConfigurationError("an Agent needs the name of the agent it serves (agent)");
    }
    this.name = options.agent;
    this.#protocol = new AgentProtocol(options);
    const concurrency = options.concurrency ?? 10;
    if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 1000) {
      throw new ConfigurationError(`concurrency must be an integer in [1, 1000], not ${concurrency}`);
    }
    this.concurrency = concurrency;
    this.#heartbeat = positive("heartbeatMs", options.heartbeatMs, 1000, 3_600_000);
    // Within the server's bounds (its `whoami`), checked by `run`.
    this.#goneAfter = positive("goneAfterMs", options.goneAfterMs, 5000);
    this.#poll = positive("pollMs", options.pollMs, 1000, 3_600_000);
    this.#claimWait = positive("claimWaitMs", options.claimWaitMs, 10_000);
    this.#drain = options.drainMs === undefined ? 30_000 : Math.max(0, options.drainMs);
    const suffix = options.instance ?? `agent-${randomBytes(8).toString("hex")}`;
    if (!/^[A-Za-z0-9_.:@-]{1,120}$/.test(suffix)) {
      throw new ConfigurationError(`an instance's name is 1 to 120 of A-Z a-z 0-9 _ . : @ -, not ${JSON.stringify(suffix)}`);
    }
    this.#suffix = suffix;
    this.#onRegistered = options.onRegistered;
    if (options.breaker !== undefined) {
      const { failures, resetAfterMs, trialCalls } = options.breaker;
      for (const [name, value] of Object.entries({ failures, trialCalls })) {
        if (value !== undefined && (!Number.isInteger(value) || value < 1)) {
          throw new ConfigurationError(`breaker.${name} must be an integer of 1 or more, not ${value}`);
        }
      }
      if (resetAfterMs !== undefined) positive("breaker.resetAfterMs", resetAfterMs, 0, 86_400_000);
    }
    this.#breakerGiven = options.breaker;
    this.#log = options.logger === null ? SILENT : (options.logger ?? consoleLogger(this.name));
    const base = retryOptions(options.retry);
    const entries = Object.entries(options.operations ?? {});
    if (entries.length === 0) throw new ConfigurationError(`agent ${this.name} has no operations`);
    for (const [name, given] of entries) {
      const spec: OperationOptions = typeof given === "function" ? { fn: given } : given;
      if (typeof spec?.fn !== "function") {
        throw new ConfigurationError(`operation ${name} is a function, or {fn, retry, limit}`);
      }
      const retry = { ...base, ...retryOptions(spec.retry) };
      // Checked alone now; over the server's defaults and within its bounds at `run`.
      this.#ops.set(name, { name, fn: spec.fn, retry, limit: spec.limit });
    }
  }

  /** The instance's name (`CLIENT/...`), once `run` has asked the server who the client is. */
  get instance(): string | null {
    return this.#instance;
  }

  /** Calls under way. */
  get inflight(): number {
    return this.#serving.size;
  }

  /**
   * Serve the agent until `signal` aborts, then stop gracefully (see the module's
   * description): resolves once the instance has left the registry. Rejects when the server
   * refuses the token for this agent (a `StepwardenError`, 401 or 403).
   */
  async run(signal?: AbortSignal): Promise<void> {
    if (this.#active) throw new Error(`agent ${this.name} is running already`);
    this.#active = true;
    this.#stopping = false;
    const stop = signal ?? new AbortController().signal;
    const onStop = (): void => {
      this.#stopping = true;
    };
    stop.addEventListener("abort", onStop, { once: true });
    const life = new AbortController();
    const loops: Promise<void>[] = [];
    let registered = false;
    try {
      const asked = await this.#untilAnswered("ask who the client is", stop, () => this.#protocol.whoami({ signal: stop }));
      if (asked === undefined) return;
      const me = asked.value;
      if (!me.agents.includes(this.name)) {
        throw new StepwardenError(
          403,
          `the client ${JSON.stringify(me.client)} may not serve agent ${JSON.stringify(this.name)}: ` +
            `its token needs the scope agent:${this.name} (its agents: ${me.agents.join(", ") || "none"})`,
        );
      }
      for (const op of this.#ops.values()) this.#policies.set(op.name, policyOf(op.retry, me));
      this.#maxExponent = me.retry_bounds.max_exponent;
      this.#maxError = me.bounds.max_error;
      const { min_ttl: minTtl, max_ttl: maxTtl, max_claim_wait: maxWait } = me.bounds;
      if (this.#goneAfter < minTtl * 1000 || this.#goneAfter > maxTtl * 1000) {
        throw new ConfigurationError(`goneAfterMs must be in [${minTtl * 1000}, ${maxTtl * 1000}], not ${this.#goneAfter}`);
      }
      if (this.#claimWait > maxWait * 1000) {
        throw new ConfigurationError(`claimWaitMs must be at most ${maxWait * 1000}, not ${this.#claimWait}`);
      }
      this.#completions.maxSize = this.#stops.maxSize = me.bounds.max_items;
      if (this.#breakerGiven !== undefined) {
        const given = this.#breakerGiven;
        this.#breaker = new CircuitBreaker(
          {
            failures: given.failures ?? me.breaker.failures,
            resetAfterMs: given.resetAfterMs ?? me.breaker.reset_after * 1000,
            trialCalls: given.trialCalls ?? me.breaker.trial_calls,
          },
          (state) => {
            this.#log.info(`circuit breaker ${state}`);
            this.#transitions.push(state);
            // A long poll under way would claim what this instance must not call now.
            if (state === "open") this.#claim?.abort();
            this.#room.set();
          },
        );
      }
      this.#instance = `${me.client}/${this.#suffix}`;
      registered = true; // left in the end, should a beat given up have been recorded
      if ((await this.#untilAnswered("register", stop, () => this.#beat(stop))) === undefined) return;
      this.#log.info(`serving as ${this.#instance}`);
      this.#onRegistered?.(this.#instance);
      loops.push(this.#beats(life.signal), this.#wakeups(life.signal), this.#watch(life.signal));
      await this.#claims(stop);
      this.#stopping = true;
      await this.#handBackHeld();
      await this.#drainCalls();
      // Once more: a claim's long poll given up may still have been answered on the server.
      await this.#handBackHeld();
    } finally {
      this.#stopping = true;
      life.abort();
      await Promise.allSettled(loops);
      if (registered) {
        await this.#recordTransitions();
        await this.#leave();
      }
      stop.removeEventListener("abort", onStop);
      this.#active = false;
    }
  }

  /** `call()`'s answer, tried again after each transient failure until `stop` (undefined
   * then); a refusal (4xx) is thrown. */
  async #untilAnswered<T>(what: string, stop: AbortSignal, call: () => Promise<T>): Promise<{ value: T } | undefined> {
    for (let failures = 1; ; failures++) {
      if (stop.aborted) return undefined;
      try {
        return { value: await call() };
      } catch (error) {
        if (stop.aborted) return undefined;
        if (!(error instanceof StepwardenError) || !error.transient) throw error;
        this.#log.warn(`cannot ${what}: ${describeError(error)}`);
        await pause(backoffMs(failures), stop);
      }
    }
  }

  #beat(signal?: AbortSignal): Promise<void> {
    return this.#protocol.beat(
      {
        instance: this.#instance!,
        operations: [...this.#ops.keys()].sort(),
        // Stopping, it takes nothing more: its room is none.
        capacity: this.#stopping ? this.#serving.size : this.concurrency,
        inflight: this.#serving.size,
        breaker: this.#breaker?.state ?? "closed",
        breaker_detail: this.#breaker?.snapshot() ?? {},
        ttl: this.#goneAfter / 1000,
      },
      { signal },
    );
  }

  /** The breaker's transitions since the last beat, as events of the history. */
  async #recordTransitions(): Promise<void> {
    while (this.#transitions.length > 0) {
      try {
        await this.#protocol.breaker({ instance: this.#instance!, state: this.#transitions[0]! });
      } catch (error) {
        this.#log.warn(`cannot record its breaker's changes: ${describeError(error)}`);
        return;
      }
      this.#transitions.shift();
    }
  }

  async #leave(): Promise<void> {
    for (let failures = 1; failures <= 3; failures++) {
      try {
        await this.#protocol.leave(this.#instance!);
        return;
      } catch (error) {
        const last = !(error instanceof StepwardenError) || !error.transient || failures === 3;
        if (last) {
          this.#log.warn(`cannot leave the registry: ${describeError(error)}`);
          return;
        }
        await sleep(backoffMs(failures));
      }
    }
  }

  // -- claiming ------------------------------------------------------------------------------

  /** The operations that may be claimed now, and their limits (an operation at its limit in
   * this instance is left out). */
  #claimable(): { operations: string[]; limits: Record<string, OperationLimit>; full: boolean } {
    const operations: string[] = [];
    const limits: Record<string, OperationLimit> = {};
    let full = false;
    for (const op of this.#ops.values()) {
      const limit = op.limit;
      if (limit === undefined) {
        operations.push(op.name);
        continue;
      }
      const room = limit.perInstance === undefined ? null : limit.perInstance - (this.#running.get(op.name) ?? 0);
      if (room !== null && room <= 0) {
        full = true;
        continue;
      }
      operations.push(op.name);
      limits[op.name] = {
        concurrency: limit.concurrency ?? null,
        rate: limit.rate ?? null,
        per: (limit.perMs ?? 1000) / 1000,
        room,
      };
    }
    return { operations: operations.sort(), limits, full };
  }

  async #claims(stop: AbortSignal): Promise<void> {
    let failures = 0;
    while (!stop.aborted) {
      this.#room.clear();
      let free = this.concurrency - this.#serving.size;
      const trial = this.#breaker?.room() ?? null;
      if (trial !== null) free = Math.min(free, trial);
      const { operations, limits, full } = this.#claimable();
      if (free <= 0 || operations.length === 0) {
        // An open breaker claims nothing until it lets a trial call through.
        await this.#room.wait(this.#breaker?.reopensInMs() ?? Infinity, stop);
        continue;
      }
      // An operation at its limit here: a call ending frees it, which a long poll would miss.
      const wait = full ? 0 : this.#claimWait / 1000;
      this.#queued.clear();
      const began = performance.now();
      let requests: ClaimedRequest[];
      const claim = new AbortController();
      this.#claim = claim;
      try {
        requests = await this.#protocol.claim(
          { instance: this.#instance!, operations, limit: free, limits, wait },
          { signal: AbortSignal.any([stop, claim.signal]) },
        );
      } catch (error) {
        if (stop.aborted) return;
        if (claim.signal.aborted) continue; // the breaker opened: claim no more
        failures++;
        this.#log.warn(`cannot claim requests: ${describeError(error)}`);
        await this.#queued.wait(backoffMs(failures, 500, 30_000), stop);
        continue;
      }
      failures = 0;
      for (const request of requests) this.#start(request);
      if (full || (requests.length === 0 && performance.now() - began < wait * 500)) {
        // Not waited, or answered empty before its wait (the server may be stopping): the
        // next claim when requests are queued, a call ends, or a poll interval has passed.
        const woken = [this.#queued.wait(this.#poll, stop)];
        if (full) woken.push(this.#room.wait(this.#poll, stop));
        await Promise.race(woken);
      }
    }
  }

  /** Serve a step this instance holds, unless it serves it already (or did). */
  #start(request: ClaimedRequest): void {
    const key = keyOf(request);
    if (this.#holds.has(key) || this.#ended.has(key)) return;
    if (this.#stopping || !this.#ops.has(request.operation)) {
      this.#track(this.#handBack([request], this.#stopping ? STOPPING : `agent ${this.name} has no operation ${request.operation}`));
      return;
    }
    const hold = new Hold(request);
    this.#holds.set(key, hold);
    this.#running.set(request.operation, (this.#running.get(request.operation) ?? 0) + 1);
    const serving: Promise<void> = this.#serve(hold)
      .catch((error: unknown) => this.#log.error(`serving ${request.idempotency_key} failed: ${describeError(error)}`))
      .finally(() => {
        hold.dispose();
        this.#holds.delete(key);
        // Remembered until its complete_by has passed: a claim's late answer, or a look at
        // the steps held, does not call it again.
        if (!hold.handedBack) this.#ended.set(key, Math.max(hold.deadline, performance.now()) + 1000);
        this.#serving.delete(serving);
        this.#running.set(request.operation, (this.#running.get(request.operation) ?? 1) - 1);
        this.#room.set();
      });
    this.#serving.add(serving);
  }

  #track(write: Promise<unknown>): void {
    this.#writes.add(write);
    const done = (): void => void this.#writes.delete(write);
    write.then(done, done);
  }

  async #handBack(requests: ClaimedRequest[], reason: string): Promise<void> {
    const items: Handback[] = requests.map((r) => ({
      ...callKey(r),
      instance: this.#instance!,
      reason,
    }));
    try {
      const applied = await this.#protocol.handBack(items);
      const back = applied.filter(Boolean).length;
      if (back > 0) this.#log.info(`handed back ${back} request(s): ${reason}`);
    } catch (error) {
      // Not handed back: the steps go to another instance once this one has left.
      this.#log.warn(`cannot hand back ${items.length} request(s): ${describeError(error)}`);
    }
  }

  /** Stopping: hand back the steps this instance holds and has not called (a claim's answer
   * that never came, as the claim's long poll was given up), but those whose call began. */
  async #handBackHeld(): Promise<void> {
    let held: ClaimedRequest[];
    try {
      held = await this.#protocol.held(this.#instance!);
    } catch (error) {
      this.#log.warn(`cannot read the steps it holds: ${describeError(error)}`);
      return;
    }
    const idle = held.filter((r) => !this.#holds.has(keyOf(r)) && !this.#ended.has(keyOf(r)));
    if (idle.length > 0) await this.#handBack(idle, STOPPING);
  }

  async #drainCalls(): Promise<void> {
    if (this.#serving.size > 0) {
      this.#log.info(`stopping: waiting up to ${this.#drain} ms for ${this.#serving.size} call(s)`);
      const done = Promise.allSettled([...this.#serving]);
      const timer = new AbortController();
      await Promise.race([done, pause(this.#drain, timer.signal)]);
      timer.abort();
    }
    if (this.#serving.size > 0) {
      this.#log.warn(`stopping: ${this.#serving.size} call(s) still under way are aborted; their steps go to another instance`);
      for (const hold of this.#holds.values()) hold.abandon();
      await Promise.allSettled([...this.#serving]);
    }
    await Promise.allSettled([...this.#writes]);
  }

  // -- the registry, wake-ups and the calls' checks -------------------------------------------

  async #beats(life: AbortSignal): Promise<void> {
    while (!life.aborted) {
      await pause(this.#heartbeat, life);
      if (life.aborted) return;
      try {
        await this.#beat(life);
        await this.#recordTransitions();
      } catch (error) {
        if (!life.aborted) this.#log.warn(`heartbeat failed: ${describeError(error)}`);
        continue;
      }
      if (this.#stopping) continue;
      try {
        await this.#takeUp(life);
      } catch (error) {
        if (!life.aborted) this.#log.warn(`cannot read the steps it holds: ${describeError(error)}`);
      }
    }
  }

  /** Call the steps the server shows held by this instance that it is not calling: a claim
   * whose answer was lost leaves them so, and they would wait for their complete_by. */
  async #takeUp(life: AbortSignal): Promise<void> {
    const held = await this.#protocol.held(this.#instance!, { signal: life });
    const now = performance.now();
    const keys = new Set(held.map(keyOf));
    for (const [key, until] of this.#ended) {
      if (until < now && !keys.has(key)) this.#ended.delete(key);
    }
    for (const request of held) {
      const key = keyOf(request);
      if (this.#stopping || this.#holds.has(key) || this.#ended.has(key)) continue;
      if (!this.#ops.has(request.operation)) continue;
      this.#log.debug(`${request.idempotency_key} attempt ${request.attempt}: held by this instance, not called: calling it`);
      this.#start(request);
    }
  }

  async #wakeups(life: AbortSignal): Promise<void> {
    for (let failures = 0; !life.aborted; ) {
      const opened = performance.now();
      try {
        for await (const wakeup of this.#protocol.wakeups(this.#instance!, 300, { signal: life })) {
          failures = 0;
          if (wakeup.kind === "requests") {
            this.#queued.set();
          } else {
            const tasks = new Set(wakeup.tasks);
            for (const hold of this.#holds.values()) {
              if (tasks.has(hold.request.task_id)) {
                this.#checkNow.set();
                break;
              }
            }
          }
        }
        if (performance.now() - opened > 1000) continue; // it ended in time: opened again
      } catch (error) {
        if (life.aborted) return;
        if (error instanceof StepwardenError && !error.transient) {
          this.#log.warn(`the wake-up stream was refused (${error.status}: ${error.message}); polling`);
          return;
        }
        this.#log.debug(`the wake-up stream ended: ${describeError(error)}`);
      }
      await pause(backoffMs(++failures, 500, 5000), life);
    }
  }

  async #watch(life: AbortSignal): Promise<void> {
    while (!life.aborted) {
      await this.#checkNow.wait(this.#poll, life);
      this.#checkNow.clear();
      if (life.aborted) return;
      await this.#checkCalls();
    }
  }

  /** Ask which of these calls (by default, those in flight) no longer hold their step, and
   * abort those. */
  async #checkCalls(holds?: Hold[]): Promise<void> {
    // A call past its complete_by is not asked about: nothing is reported of it any more.
    const asked = (holds ?? [...this.#holds.values()].filter((h) => h.ending === undefined && !h.answered)).filter(
      (h) => !h.expireIfPast(),
    );
    if (asked.length === 0) return;
    let lost;
    try {
      lost = await this.#protocol.lost(this.#instance!, asked.map((h) => callKey(h.request)));
    } catch (error) {
      this.#log.warn(`cannot check its calls: ${describeError(error)}`);
      return;
    }
    const byKey = new Map(asked.map((h) => [h.key, h]));
    for (const call of lost) {
      const hold = byKey.get(keyOf(call));
      if (hold !== undefined && hold.cancelled === null) {
        const which = `${hold.request.idempotency_key} attempt ${hold.request.attempt}`;
        // A call whose outcome was refused has returned already: there is nothing to abort.
        if (hold.answered) this.#log.info(`${which}: its outcome came once the step was no longer its own: ${call.why}`);
        else this.#log.info(`${which}: aborting the call: ${call.why}`);
        hold.lose(call.why);
      }
    }
  }

  // -- serving --------------------------------------------------------------------------------

  async #heartbeatOf(hold: Hold, detail: Json): Promise<number> {
    const r = hold.request;
    if (hold.ending !== undefined) {
      throw hold.cancelled !== null ? new StepLostError(hold.cancelled) : hold.controller.signal.reason;
    }
    let remaining: number | null;
    try {
      remaining = await this.#protocol.heartbeat(callKey(r), this.#instance!, detail);
    } catch (error) {
      if (error instanceof StepwardenError && error.transient) {
        // Not fatal: the step keeps its complete_by; the next beat may get through.
        this.#log.warn(`heartbeat of ${r.idempotency_key}: ${describeError(error)}`);
        return hold.remainingMs();
      }
      throw error;
    }
    if (remaining === null) {
      await this.#checkCalls([hold]); // why, if the server can tell
      if (hold.ending === undefined) hold.forsake("the step is no longer held by this call");
      throw new StepLostError(hold.cancelled ?? "the step is no longer held by this call");
    }
    if (hold.ending === undefined) hold.moveTo(remaining);
    return remaining * 1000;
  }

  async #serve(hold: Hold): Promise<void> {
    const r = hold.request;
    const op = this.#ops.get(r.operation)!;
    const retry = this.#policies.get(op.name)!;
    const args: unknown[] = Array.isArray(r.input) ? r.input : [r.input];
    const what = `${this.name}.${op.name} for ${r.idempotency_key}`;
    const beat = (detail: Json): Promise<number> => this.#heartbeatOf(hold, detail);
    for (let tries = 1; ; tries++) {
      if (hold.ending !== undefined) return this.#afterAbort(hold, what, undefined);
      if (this.#breaker !== null && !this.#breaker.allow()) return this.#breakerOpen(hold);
      const call = new Call(hold, tries, beat);
      const running = (async () => op.fn(call, ...args))();
      const settled = await settle(running, hold.controller.signal);
      // Settled past complete_by (its timer not fired yet: the process was stopped, say): an
      // outcome now would be refused, so none is reported.
      hold.expireIfPast();
      const permanent =
        settled.kind === "error" && (settled.error instanceof PermanentError || retry.isPermanent?.(settled.error) === true);
      if (this.#breaker !== null) {
        if (hold.ending !== undefined || settled.kind === "aborted") this.#breaker.abandon();
        else if (settled.kind === "value" || permanent) this.#breaker.success();
        else this.#breaker.failure();
      }
      if (hold.ending !== undefined || settled.kind === "aborted") {
        // Whatever it answered once its step was not its own any more is discarded.
        return this.#afterAbort(hold, what, running);
      }
      if (settled.kind === "value") {
        let result: Json;
        try {
          result = JSON.parse(JSON.stringify(settled.value ?? null) ?? "null") as Json;
        } catch (error) {
          const message = `PayloadError: the result of ${this.name}.${op.name} is not JSON: ${describeError(error)}`;
          return this.#report(hold, { state: "failed", result: null, error: message, tries });
        }
        return this.#report(hold, { state: "completed", result, error: null, tries });
      }
      const error = settled.error;
      const message = errorText(error);
      // Logged as the server keeps it at most: its start.
      const shown = message.length <= this.#maxError ? message : `${message.slice(0, this.#maxError)}...`;
      if (permanent) {
        this.#log.info(`${what}: failed for good (${shown})`);
        return this.#report(hold, { state: "failed", result: null, error: message, tries });
      }
      // This failure opened the breaker: another instance may reach the service.
      if (this.#breaker?.state === "open") return this.#breakerOpen(hold);
      if (tries >= retry.maxAttempts) {
        this.#log.warn(`${what}: giving up after ${tries} tries (${shown}); the supervisor will retry the step`);
        return;
      }
      const ceiling = Math.min(
        retry.maxMs,
        retry.initialMs * retry.multiplier ** Math.min(tries - 1, this.#maxExponent),
      );
      const delay = retry.jitter ? Math.random() * ceiling : ceiling;
      if (hold.passesWithin(delay)) {
        this.#log.info(`${what}: no time left to retry (${shown})`);
        return;
      }
      this.#log.debug(`${what}: try ${tries} failed (${shown}), retrying in ${Math.round(delay)} ms`);
      await pause(delay, hold.controller.signal);
    }
  }

  /** The breaker is open: the request goes back to the queue, for another instance. */
  async #breakerOpen(hold: Hold): Promise<void> {
    hold.handedBack = true;
    await this.#handBack([hold.request], `agent ${this.name}: open`);
  }

  /** The call's hold ended (`hold.ending`): once a lost call has ended (before its
   * complete_by), the server is told; otherwise nothing is reported. */
  async #afterAbort(hold: Hold, what: string, running: Promise<unknown> | undefined): Promise<void> {
    if (hold.ending === "expired") {
      this.#log.info(`${what}: complete_by passed, stopping`);
      return;
    }
    if (hold.ending === "gone") this.#log.info(`${what}: the step is no longer held by this call`);
    if (hold.ending !== "lost") return;
    const why = hold.cancelled ?? "the step is no longer held by this call";
    if (running !== undefined) {
      const ended = running.then(() => true, () => true);
      const done = await Promise.race([ended, hold.over.then(() => false)]);
      if (!done) {
        this.#log.warn(`${what}: the operation did not end when its signal was aborted (${why})`);
        return;
      }
    }
    this.#log.info(`${what}: cancelled (${why})`);
    const item: Handback = { ...callKey(hold.request), instance: this.#instance!, reason: why };
    await this.#beforeCompleteBy(hold, `cannot say that the call of ${hold.request.idempotency_key} stopped`, () =>
      this.#stops.submit(item).then((applied) => [applied]),
    );
  }

  async #report(
    hold: Hold,
    outcome: { state: "completed" | "failed"; result: Json; error: string | null; tries: number },
  ): Promise<void> {
    const r = hold.request;
    hold.answered = true;
    const { error, ...rest } = outcome;
    // The server keeps the start of a long error, with a marker of its length: only that
    // start is sent.
    const cut = error === null ? { error: null } : { error: error.slice(0, this.#maxError), error_length: error.length };
    const applied = await this.#beforeCompleteBy(hold, `cannot record the outcome of ${r.idempotency_key}`, () =>
      this.#completions.submit({ ...callKey(r), instance: this.#instance!, ...rest, ...cut }).then((applied) => [applied]),
    );
    if (applied === undefined || applied[0]) return;
    this.#log.info(`late outcome of ${r.task_id}/${r.seq} attempt ${r.attempt} discarded`);
    // The step was taken from this call as it answered (its task cancelled...): the call has
    // ended, which a compensation waiting for it needs to know.
    await this.#checkCalls([hold]);
    if (hold.ending === "lost") await this.#afterAbort(hold, `${this.name}.${r.operation} for ${r.idempotency_key}`, undefined);
  }

  /** `write()`'s answer, tried again after each transient failure while the step's
   * complete_by has not passed (after it, the write could only be refused); undefined when
   * no answer came. */
  async #beforeCompleteBy<T>(hold: Hold, what: string, write: () => Promise<T>): Promise<T | undefined> {
    for (let failures = 1; ; failures++) {
      try {
        return await write();
      } catch (error) {
        if (!(error instanceof StepwardenError) || !error.transient) {
          this.#log.error(`${what}: ${describeError(error)}`);
          return undefined;
        }
        const delay = backoffMs(failures, 100, 2000);
        if (hold.passesWithin(delay) || hold.abandoned) {
          this.#log.warn(`${what} before its complete_by (${describeError(error)}); the supervisor will retry it`);
          return undefined;
        }
        await Promise.race([sleep(delay), hold.over]);
        if (hold.abandoned) return undefined;
      }
    }
  }
}
