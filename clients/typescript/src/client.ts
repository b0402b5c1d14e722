/**
 * The application API's client (`/api/v1`): submit a task, read its status, wait for its
 * result, follow its status messages, send it an event, cancel it.
 */

import { ResultTimeoutError, StepwardenError } from "./errors.js";
import { Http, refusal, segment, type ServerOptions } from "./http.js";
import { parseServerSentEvents } from "./sse.js";
import { sleep } from "./timing.js";
import {
  cancelOutcome,
  statusMessage,
  taskResult,
  taskStatus,
  type CancelOutcome,
  type Json,
  type SendAnswer,
  type StatusMessage,
  type TaskResult,
  type TaskStatus,
  type Wire,
} from "./types.js";

const API = "/api/v1";
/** The longest a result's long poll waits on the server, in milliseconds. */
const MAX_POLL = 60_000;
/** Milliseconds of the long polls when no overall timeout is given. */
const DEFAULT_POLL = 30_000;
/** Milliseconds before a stream is opened again, until the server says (`retry:`). */
const DEFAULT_RETRY = 2000;
/** The longest wait between two tries of a server out of reach, in milliseconds. */
const MAX_RETRY = 30_000;

export interface SubmitOptions {
  /** The task's id (default: a new one). A submit is idempotent by it. */
  taskId?: string;
  /** Higher runs first among the tasks waiting for a scheduler. */
  priority?: number;
  /** The channel of the task's status messages (what `messages` follows). */
  replyTo?: string;
  /** Start no sooner than this time. */
  startAt?: Date | string;
  /** Start no sooner than this many milliseconds after the submit. */
  startAfterMs?: number;
  /** The version of the workflow to run (default: the newest declared). */
  version?: number;
  /** Who the task belongs to (default: this client); another only when the client's tokens
   * entry grants it. */
  tenant?: string;
  signal?: AbortSignal;
}

export interface ResultOptions {
  /** Milliseconds to wait for the task to finish, in all (default: as long as it takes; 0:
   * ask once, without waiting). */
  timeoutMs?: number;
  signal?: AbortSignal;
}

export interface MessagesOptions {
  /** Resume after this message id (the last one handled). */
  lastEventId?: number;
  /** Ends the iteration (it throws the abort's reason). */
  signal?: AbortSignal;
}

export interface CancelOptions {
  /** Undo the task's completed steps first: it ends compensated, or compensation_failed. */
  compensate?: boolean;
  signal?: AbortSignal;
}

/** A task submitted: its id, whether this submit created it, and what may be asked of it. */
export class TaskHandle {
  readonly taskId: string;
  /** False when a task of this id was submitted before (with the same workflow and input):
   * this handle is that task's. */
  readonly created: boolean;
  readonly #client: Client;

  /** @internal */
  constructor(client: Client, taskId: string, created: boolean) {
    this.#client = client;
    this.taskId = taskId;
    this.created = created;
  }

  /** The task's outcome once it has finished (`Client.result`). */
  result(options: ResultOptions = {}): Promise<TaskResult> {
    return this.#client.result(this.taskId, options);
  }

  /** Cancel the task (`Client.cancel`). */
  cancel(reason?: string, options: CancelOptions = {}): Promise<CancelOutcome> {
    return this.#client.cancel(this.taskId, reason, options);
  }

  /** The task's status (`Client.status`). */
  status(options: { signal?: AbortSignal } = {}): Promise<TaskStatus> {
    return this.#client.status(this.taskId, options);
  }

  /** The task's status messages (`Client.messages`). */
  messages(options: MessagesOptions = {}): AsyncGenerator<StatusMessage> {
    return this.#client.messages(this.taskId, options);
  }

  /** Send the task an event (`Client.sendEvent`). */
  sendEvent(name: string, payload: unknown = null, eventId?: string, options: { signal?: AbortSignal } = {}): Promise<SendAnswer> {
    return this.#client.sendEvent(this.taskId, name, payload, eventId, options);
  }
}

/** A client of the application API, with a client's token (`new Client({url, token})`). */
export class Client {
  readonly #http: Http;

  constructor(options: ServerOptions) {
    this.#http = new Http(options);
  }

  get url(): string {
    return this.#http.url;
  }

  /** Submit a task of `workflow` with its JSON `input` (scope submit): its handle. */
  async submit(workflow: string, input: unknown = null, options: SubmitOptions = {}): Promise<TaskHandle> {
    const body: Wire["SubmitRequest"] = { workflow, input: input === undefined ? null : input };
    if (options.taskId !== undefined) body.task_id = options.taskId;
    if (options.priority !== undefined) body.priority = options.priority;
    if (options.replyTo !== undefined) body.reply_to = options.replyTo;
    if (options.startAt !== undefined) {
      body.start_at = options.startAt instanceof Date ? options.startAt.toISOString() : options.startAt;
    }
    if (options.startAfterMs !== undefined) body.start_after = options.startAfterMs / 1000;
    if (options.version !== undefined) body.version = options.version;
    if (options.tenant !== undefined) body.tenant = options.tenant;
    const answer = await this.#http.json<Wire["SubmitAnswer"]>("POST", `${API}/tasks`, { body, signal: options.signal });
    return new TaskHandle(this, answer.task_id, answer.created);
  }

  /** The handle of a task submitted before, by its id. */
  task(taskId: string): TaskHandle {
    return new TaskHandle(this, taskId, false);
  }

  /** The task's status (scope read). */
  async status(taskId: string, options: { signal?: AbortSignal } = {}): Promise<TaskStatus> {
    return taskStatus(await this.#http.json<Wire["TaskStatus"]>("GET", `${API}/tasks/${segment(taskId)}`, options));
  }

  /**
   * The task's outcome once it has finished (scope read): long polls of the server, one
   * after another, until it has or `timeoutMs` milliseconds have passed (then
   * `ResultTimeoutError`).
   * A finished task that did not succeed is an outcome too: its `state` and `error` say how
   * it ended. A server out of reach, or restarting, is asked again within the timeout.
   */
  async result(taskId: string, options: ResultOptions = {}): Promise<TaskResult> {
    const { timeoutMs, signal } = options;
    if (timeoutMs !== undefined && !(timeoutMs >= 0)) {
      throw new RangeError(`timeoutMs must be milliseconds (0 or more), not ${timeoutMs}`);
    }
    const until = timeoutMs === undefined ? Infinity : performance.now() + timeoutMs;
    let failures = 0;
    let status: TaskStatus | undefined;
    for (;;) {
      const left = Math.max(0, until - performance.now());
      const wait = timeoutMs === undefined ? DEFAULT_POLL : Math.min(MAX_POLL, left);
      let answer: Response;
      try {
        answer = await this.#http.fetch("GET", `${API}/results/${segment(taskId)}`, {
          query: { timeout: Number((wait / 1000).toFixed(3)) },
          signal,
        });
      } catch (error) {
        if (!(error instanceof StepwardenError) || !error.transient) throw error;
        failures = await this.#retry(failures, until, signal, error);
        continue;
      }
      if (answer.status === 200) return taskResult((await answer.json()) as Wire["TaskResult"]);
      if (answer.status === 202) {
        failures = 0;
        status = taskStatus((await answer.json()) as Wire["TaskStatus"]);
      } else {
        const error = await refusal(answer, "the result");
        if (!error.transient) throw error;
        failures = await this.#retry(failures, until, signal, error);
        continue;
      }
      if (performance.now() >= until) {
        throw new ResultTimeoutError(
          `task ${JSON.stringify(taskId)} has not finished within ${timeoutMs} ms`,
          status,
        );
      }
    }
  }

  /** Wait before asking again after a failure, within the overall timeout. */
  async #retry(failures: number, until: number, signal: AbortSignal | undefined, error: StepwardenError): Promise<number> {
    const delay = Math.min(MAX_RETRY, 250 * 2 ** Math.min(failures, 10));
    if (performance.now() + delay >= until) throw error;
    await sleep(delay, signal);
    return failures + 1;
  }

  /**
   * The task's status messages (scope read), in order, as they are published: an async
   * iterator over the server-sent events of `GET /api/v1/messages/{id}`. A stream that ends
   * or breaks is opened again with `Last-Event-ID`, until the server says that nothing more
   * will come (the task has finished: 204). A task submitted without `replyTo` has none
   * (409). Leaving the loop (`break`) closes the stream.
   */
  async *messages(taskId: string, options: MessagesOptions = {}): AsyncGenerator<StatusMessage> {
    const { signal } = options;
    let last = options.lastEventId;
    let retry = DEFAULT_RETRY;
    let failures = 0;
    for (;;) {
      signal?.throwIfAborted();
      let answer: Response;
      try {
        answer = await this.#http.fetch("GET", `${API}/messages/${segment(taskId)}`, {
          headers: {
            Accept: "text/event-stream",
            ...(last === undefined ? {} : { "Last-Event-ID": String(last) }),
          },
          signal,
        });
      } catch (error) {
        if (!(error instanceof StepwardenError) || !error.transient) throw error;
        await sleep(Math.min(MAX_RETRY, retry * 2 ** Math.min(failures++, 4)), signal);
        continue;
      }
      if (answer.status === 204) {
        await answer.body?.cancel();
        return;
      }
      if (answer.status !== 200 || answer.body === null) {
        const error = await refusal(answer, "the status messages");
        if (!error.transient) throw error;
        await sleep(Math.min(MAX_RETRY, retry * 2 ** Math.min(failures++, 4)), signal);
        continue;
      }
      let got = 0;
      try {
        const events = parseServerSentEvents(answer.body, { onRetry: (ms) => (retry = ms) });
        for await (const event of events) {
          const message = statusMessage(JSON.parse(event.data) as Wire["StatusMessage"]);
          last = event.id !== undefined && /^[0-9]+$/.test(event.id) ? Number(event.id) : message.id;
          failures = 0;
          got++;
          yield message;
        }
      } catch (error) {
        if (signal?.aborted) throw signal.reason;
        if (error instanceof SyntaxError) throw new StepwardenError(200, `a status message is not JSON: ${error.message}`);
        // The connection broke: opened again after the server's retry delay.
        await sleep(retry, signal);
        continue;
      }
      // The stream ended (after a finished state, or as the server stopped): opened again at
      // once, to hear 204 or the messages since; after a delay if it brought nothing.
      if (got === 0) await sleep(retry, signal);
    }
  }

  /** Send the task an event (scope events): kept until its workflow waits for `name`.
   * `eventId` makes it idempotent: sent again, it answers `{ sent: false }`, whatever the
   * task's state now. */
  async sendEvent(
    taskId: string,
    name: string,
    payload: unknown = null,
    eventId?: string,
    options: { signal?: AbortSignal } = {},
  ): Promise<SendAnswer> {
    const body: Record<string, unknown> = { name, payload: (payload ?? null) as Json };
    if (eventId !== undefined) body.event_id = eventId;
    return this.#http.json<Wire["SendAnswer"]>("POST", `${API}/events/${segment(taskId)}`, {
      body,
      signal: options.signal,
    });
  }

  /** Cancel the task (scope cancel), recorded in its history with `reason` and the client's
   * name. */
  async cancel(taskId: string, reason?: string, options: CancelOptions = {}): Promise<CancelOutcome> {
    const body: Record<string, unknown> = {};
    if (reason !== undefined) body.reason = reason;
    if (options.compensate) body.compensate = true;
    const answer = await this.#http.json<Wire["OutcomeAnswer"]>("POST", `${API}/cancel/${segment(taskId)}`, {
      body,
      signal: options.signal,
    });
    return cancelOutcome(taskId, answer);
  }
}
