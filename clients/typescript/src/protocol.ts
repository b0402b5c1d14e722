/**
 * The agent protocol (`/api/v1/agents/{agent}/...`), one method a route: what `Agent` asks of
 * the server. Every write about a step names the fencing token its claim gave (task_id, seq,
 * attempt, instance): the server applies it only while the step is still held so. A token
 * serves the agents its scopes name (`agent:NAME`), as instances named `CLIENT/...`.
 */

import { StepwardenError } from "./errors.js";
import type { paths } from "./generated/openapi.js";
import { Http, refusal, segment, type ServerOptions } from "./http.js";
import { parseServerSentEvents } from "./sse.js";
import type { CallKey, ClaimedRequest, Handback, Json, LostCall, Outcome, WhoAmI } from "./types.js";

const AGENTS = "/api/v1/agents";

/** The routes of one agent, by their last segment, as the document names them. */
type Route = {
  [P in keyof paths]: P extends `/api/v1/agents/{agent}/${infer R}` ? (paths[P] extends { post: unknown } ? R : never) : never;
}[keyof paths];
type Post<R extends Route> = paths[`/api/v1/agents/{agent}/${R}`]["post"];
/** The JSON body of a route's request, as generated from the document. */
export type BodyOf<R extends Route> = Post<R> extends { requestBody: { content: { "application/json": infer B } } } ? B : never;
/** The JSON of a route's answer (200), as generated from the document. */
export type AnswerOf<R extends Route> = Post<R> extends { responses: { 200: { content: { "application/json": infer A } } } }
  ? A
  : void;

export type BeatBody = BodyOf<"beat">;
export type ClaimBody = BodyOf<"claim">;

/** A wake-up of `wakeups`: requests queued for the agent, or tasks whose calls may have to
 * stop (ask `lost`). */
export type Wakeup = { kind: "requests"; agents: string[] } | { kind: "calls"; tasks: string[] };

type Signal = { signal?: AbortSignal | undefined };

/** The agent protocol's routes for one agent, with a client's token. */
export class AgentProtocol {
  readonly http: Http;
  readonly agent: string;

  constructor(options: ServerOptions & { agent: string }) {
    this.http = new Http(options);
    this.agent = options.agent;
  }

  #path(route: string): string {
    return `${AGENTS}/${segment(this.agent)}/${route}`;
  }

  #post<R extends Route>(route: R, body: BodyOf<R>, options: Signal = {}): Promise<AnswerOf<R>> {
    return this.http.json<AnswerOf<R>>("POST", this.#path(route), { body, signal: options.signal });
  }

  /** Record a transition of the instance's circuit breaker (an event of the history). */
  async breaker(body: BodyOf<"breaker">, options: Signal = {}): Promise<void> {
    await this.#post("breaker", body, options);
  }

  /** The client the token names, and the agents it may serve. */
  whoami(options: Signal = {}): Promise<WhoAmI> {
    return this.http.json<WhoAmI>("GET", `${AGENTS}/whoami`, options);
  }

  /** Register or refresh the instance in the registry. */
  async beat(body: BeatBody, options: Signal = {}): Promise<void> {
    await this.#post("beat", body, options);
  }

  /** The instance stops: it leaves the registry, the steps it still runs go to others. */
  async leave(instance: string, options: Signal = {}): Promise<void> {
    await this.#post("leave", { instance }, options);
  }

  /** Claim queued requests of these operations, by priority (a long poll with `wait`). */
  async claim(body: ClaimBody, options: Signal = {}): Promise<ClaimedRequest[]> {
    return (await this.#post("claim", body, options)).requests as ClaimedRequest[];
  }

  /** The steps of the agent the instance holds (a claim whose answer was lost leaves them so). */
  async held(instance: string, options: Signal = {}): Promise<ClaimedRequest[]> {
    return (await this.#post("held", { instance }, options)).requests as ClaimedRequest[];
  }

  /** Which of these calls of the instance no longer hold their step, each with why. */
  async lost(instance: string, calls: CallKey[], options: Signal = {}): Promise<LostCall[]> {
    if (calls.length === 0) return [];
    return (await this.#post("lost", { instance, calls }, options)).lost as LostCall[];
  }

  /** A running call's heartbeat: the seconds now left to its step, or null: the step is no
   * longer the call's (stop it). */
  async heartbeat(key: CallKey, instance: string, detail: Json = null, options: Signal = {}): Promise<number | null> {
    const body = { task_id: key.task_id, seq: key.seq, attempt: key.attempt, instance, detail };
    return (await this.#post("heartbeat", body, options)).remaining ?? null;
  }

  /** Record outcomes; for each, whether it was applied (false: the step was no longer the
   * call's, the outcome is discarded). */
  async complete(items: Outcome[], options: Signal = {}): Promise<boolean[]> {
    return (await this.#post("complete", { items }, options)).applied;
  }

  /** Put claimed requests back in the queue, for another instance (the same attempt). */
  async handBack(items: Handback[], options: Signal = {}): Promise<boolean[]> {
    return (await this.#post("hand-back", { items }, options)).applied;
  }

  /** Say that calls of steps the instance no longer holds have stopped. */
  async stopped(items: Handback[], options: Signal = {}): Promise<boolean[]> {
    return (await this.#post("stopped", { items }, options)).applied;
  }

  /**
   * The wake-up stream, until the server ends it (after `seconds`) or `signal` aborts; a
   * `StepwardenError` when it is refused.
   */
  async *wakeups(instance: string, seconds = 300, options: Signal = {}): AsyncGenerator<Wakeup> {
    const answer = await this.http.fetch("GET", this.#path("wakeups"), {
      query: { instance, seconds },
      headers: { Accept: "text/event-stream" },
      signal: options.signal,
    });
    if (answer.status !== 200 || answer.body === null) {
      throw await refusal(answer, "the wake-up stream");
    }
    for await (const event of parseServerSentEvents(answer.body)) {
      let data: unknown;
      try {
        data = JSON.parse(event.data);
      } catch {
        throw new StepwardenError(200, `a wake-up is not JSON: ${event.data.slice(0, 100)}`);
      }
      const names = Array.isArray(data) ? data.map(String) : [];
      if (event.event === "requests") yield { kind: "requests", agents: names };
      else if (event.event === "calls") yield { kind: "calls", tasks: names };
    }
  }
}
