/**
 * Group commit, as the Python runner's (`stepwarden._batch.Batcher`): callers hand in one
 * item each; the items that arrive while a write is under way are written together by the
 * next one, in one request (at most `maxSize` items a request).
 */

export class Batcher<In, Out> {
  readonly #write: (items: In[]) => Promise<Out[]>;
  #maxSize: number;
  #queue: { item: In; resolve: (out: Out) => void; reject: (error: unknown) => void }[] = [];
  #flushing: Promise<void> | null = null;

  constructor(write: (items: In[]) => Promise<Out[]>, maxSize: number) {
    this.#write = write;
    this.#maxSize = maxSize;
  }

  /** The most items of one write (the server's bound, once known). */
  set maxSize(value: number) {
    this.#maxSize = Math.max(1, value);
  }

  /** The item's answer, once the write that took it is answered (its error, if it failed). */
  submit(item: In): Promise<Out> {
    const answer = new Promise<Out>((resolve, reject) => this.#queue.push({ item, resolve, reject }));
    this.#flushing ??= this.#flush();
    return answer;
  }

  async #flush(): Promise<void> {
    try {
      // One turn of the event loop: the calls that ended together add theirs.
      await new Promise((resolve) => setImmediate(resolve));
      while (this.#queue.length > 0) {
        const batch = this.#queue.splice(0, this.#maxSize);
        try {
          const answers = await this.#write(batch.map((entry) => entry.item));
          batch.forEach((entry, i) => entry.resolve(answers[i]!));
        } catch (error) {
          for (const entry of batch) entry.reject(error);
        }
      }
    } finally {
      this.#flushing = null;
    }
  }

  /** Once every item handed in so far is written. */
  async drain(): Promise<void> {
    while (this.#flushing !== null) await this.#flushing;
  }
}
