/**
 * Waits: a sleep an abort ends, and a flag that wakes whoever waits for it.
 */

/** Resolves after `ms` milliseconds; rejects with the abort's reason once `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, Math.max(0, ms));
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** Resolves after `ms` milliseconds, or at once when `signal` aborts (never rejects). */
export function pause(ms: number, signal?: AbortSignal): Promise<void> {
  return sleep(ms, signal).catch(() => undefined);
}

/** Resolves once `signal` has aborted. */
export function aborted(signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
}

/**
 * A flag set by one side and waited for by the other: `wait()` resolves at the next `set()`
 * (or at once if it was set since the last `clear()`), after `ms` milliseconds, or when
 * `signal` aborts, whichever comes first; true when the flag was set.
 */
export class Flag {
  #set = false;
  #waiters = new Set<() => void>();

  set(): void {
    this.#set = true;
    const waiters = [...this.#waiters];
    this.#waiters.clear();
    for (const wake of waiters) wake();
  }

  clear(): void {
    this.#set = false;
  }

  get isSet(): boolean {
    return this.#set;
  }

  wait(ms = Infinity, signal?: AbortSignal): Promise<boolean> {
    if (this.#set) return Promise.resolve(true);
    if (signal?.aborted) return Promise.resolve(false);
    return new Promise((resolve) => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const done = (value: boolean): void => {
        this.#waiters.delete(wake);
        if (timer !== undefined) clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        resolve(value);
      };
      const wake = (): void => done(true);
      const onAbort = (): void => done(false);
      this.#waiters.add(wake);
      if (Number.isFinite(ms)) timer = setTimeout(() => done(this.#set), Math.max(0, ms));
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }
}
