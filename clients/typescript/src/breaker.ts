/**
 * An agent instance's circuit breaker, as the Python runner's (`stepwarden.Breaker`): closed,
 * it counts consecutive transient failures and opens at `failures`. Open, no call goes to the
 * service and the instance claims nothing for the agent (instances whose service answers take
 * the requests); after `resetAfterMs` it is half-open: up to `trialCalls` calls go through, a
 * success closes it, a failure opens it again. A permanent error is an answer of the service:
 * a success here.
 */

export type BreakerState = "closed" | "open" | "half_open";

export interface BreakerOptions {
  /** Consecutive transient failures that open the breaker. */
  failures?: number;
  /** Milliseconds the breaker stays open before letting trial calls through (half-open). */
  resetAfterMs?: number;
  /** Calls let through at once while half-open. */
  trialCalls?: number;
}

export class CircuitBreaker {
  readonly failuresToOpen: number;
  readonly resetAfterMs: number;
  readonly trialCalls: number;
  state: BreakerState = "closed";
  failures = 0;
  /** Times it opened. */
  opened = 0;
  #openedAt = 0;
  #trials = 0;
  readonly #onChange: (state: BreakerState) => void;

  constructor(options: Required<BreakerOptions>, onChange: (state: BreakerState) => void) {
    this.failuresToOpen = options.failures;
    this.resetAfterMs = options.resetAfterMs;
    this.trialCalls = options.trialCalls;
    this.#onChange = onChange;
  }

  #move(state: BreakerState): void {
    if (state === this.state) return;
    this.state = state;
    this.#onChange(state);
  }

  #refresh(): void {
    if (this.state === "open" && performance.now() - this.#openedAt >= this.resetAfterMs) {
      this.#trials = 0;
      this.#move("half_open");
    }
  }

  /** How many more calls may start now: null when any number may (closed). */
  room(): number | null {
    this.#refresh();
    if (this.state === "closed") return null;
    if (this.state === "open") return 0;
    return Math.max(0, this.trialCalls - this.#trials);
  }

  /** Milliseconds until an open breaker lets a trial call through (null unless open). */
  reopensInMs(): number | null {
    if (this.state !== "open") return null;
    return Math.max(0, this.#openedAt + this.resetAfterMs - performance.now());
  }

  /** Whether a call may go to the service now (a half-open breaker counts it as a trial):
   * every call allowed ends in `success`, `failure` or `abandon`. */
  allow(): boolean {
    const room = this.room();
    if (room === null) return true;
    if (room <= 0) return false;
    this.#trials++;
    return true;
  }

  success(): void {
    this.failures = 0;
    if (this.state === "half_open") this.#trials = Math.max(0, this.#trials - 1);
    this.#move("closed");
  }

  /** An allowed call ended with no word on the service (its step was lost). */
  abandon(): void {
    if (this.state === "half_open") this.#trials = Math.max(0, this.#trials - 1);
  }

  failure(): void {
    this.failures++;
    if (this.state === "half_open" || (this.state === "closed" && this.failures >= this.failuresToOpen)) {
      this.#trials = 0;
      this.#openedAt = performance.now();
      this.opened++;
      this.#move("open");
    }
  }

  /** What the registry publishes of the breaker. */
  snapshot(): Record<string, number> {
    this.#refresh();
    const detail: Record<string, number> = { failures: this.failures, opened: this.opened };
    const reopens = this.reopensInMs();
    if (reopens !== null) detail.half_open_in = Math.round(reopens) / 1000;
    return detail;
  }
}
