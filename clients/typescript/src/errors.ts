/**
 * The errors of the client and of the agent runner.
 */

/**
 * A request the server refused, or could not be sent: `status` is the HTTP status (0 when no
 * answer came: the server could not be reached, the connection broke), `message` the
 * server's `error` when it said one.
 */
export class StepwardenError extends Error {
  override name = "StepwardenError";
  /** The HTTP status of the answer; 0 when none came. */
  readonly status: number;
  /** The answer's JSON body, when it had one. */
  readonly body: unknown;

  constructor(status: number, message: string, options: { body?: unknown; cause?: unknown } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.status = status;
    this.body = options.body;
  }

  /** Worth asking again: no answer came, the server is unavailable (5xx) or throttles (429). */
  get transient(): boolean {
    return this.status === 0 || this.status === 429 || this.status >= 500;
  }
}

/** `Client.result` gave up: the task had not finished within the timeout asked. */
export class ResultTimeoutError extends StepwardenError {
  override name = "ResultTimeoutError";
  /** The task's status at the last answer (202). */
  readonly taskStatus: unknown;

  constructor(message: string, taskStatus: unknown) {
    super(202, message, { body: taskStatus });
    this.taskStatus = taskStatus;
  }
}

/**
 * Thrown by an operation: the step cannot succeed, whatever the retries (a declined card, an
 * address no courier serves). The call is not tried again: the step fails at once, and its
 * task goes on as its workflow says (compensating, by default).
 */
export class PermanentError extends Error {
  override name = "PermanentError";
}

/**
 * The call no longer holds its step: its task was cancelled, paused or sent to compensating,
 * the step was abandoned, dispatched again or given to another instance (`why` says which).
 * The reason of a call's aborted `signal`, and what `Call.heartbeat` throws then: stop.
 */
export class StepLostError extends Error {
  override name = "StepLostError";
  /** Why the step is no longer the call's, as the server said it. */
  readonly why: string;

  constructor(why: string) {
    super(`the step is no longer held by this call: ${why}`);
    this.why = why;
  }
}

/** The agent runner cannot start: a wrong URL, a token that may not serve the agent. */
export class ConfigurationError extends Error {
  override name = "ConfigurationError";
}
