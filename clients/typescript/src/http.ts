/**
 * Requests to a stepwarden server with a client's token: JSON in and out, every refusal a
 * `StepwardenError` with the status and the server's `error`.
 */

import { ConfigurationError, StepwardenError } from "./errors.js";

export interface ServerOptions {
  /** The server's base URL (`https://ops.example.com`, `http://127.0.0.1:8080`). */
  url: string;
  /** A client's token (`stepwarden api-token NAME --scope ...`). */
  token: string;
}

export interface RequestOptions {
  body?: unknown;
  query?: Record<string, string | number | undefined>;
  headers?: Record<string, string>;
  signal?: AbortSignal | undefined;
}

/** A path segment: a task id holding `/` or `?` stays one segment. */
export function segment(value: string): string {
  return encodeURIComponent(value);
}

export class Http {
  readonly url: string;
  readonly #authorization: string;

  constructor(options: ServerOptions) {
    const url = String(options.url ?? "");
    if (!/^https?:\/\/[^/]/.test(url)) {
      throw new ConfigurationError(`the server's URL is http(s)://..., not ${JSON.stringify(url)}`);
    }
    if (!options.token) {
      throw new ConfigurationError("the server needs a client's token");
    }
    this.url = url.replace(/\/+$/, "");
    this.#authorization = `Bearer ${options.token}`;
  }

  /**
   * The answer to a request, whatever its status; a `StepwardenError` of status 0 when none
   * came (the abort's own reason when `signal` was aborted).
   */
  async fetch(method: string, path: string, options: RequestOptions = {}): Promise<Response> {
    let target = this.url + path;
    const query = Object.entries(options.query ?? {}).filter(([, v]) => v !== undefined);
    if (query.length > 0) {
      target += "?" + new URLSearchParams(query.map(([k, v]): [string, string] => [k, String(v)])).toString();
    }
    const headers: Record<string, string> = {
      Authorization: this.#authorization,
      Accept: "application/json",
      ...options.headers,
    };
    let body: string | undefined;
    if (options.body !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(options.body);
    }
    try {
      return await fetch(target, { method, headers, body, signal: options.signal ?? null });
    } catch (error) {
      if (options.signal?.aborted) throw options.signal.reason;
      throw new StepwardenError(0, `${method} ${this.url}${path}: no answer (${describe(error)})`, {
        cause: error,
      });
    }
  }

  /** The JSON answer of a request answered 2xx; a `StepwardenError` otherwise. */
  async json<T>(method: string, path: string, options: RequestOptions = {}): Promise<T> {
    const answer = await this.fetch(method, path, options);
    if (!answer.ok) throw await refusal(answer, `${method} ${path}`);
    if (answer.status === 204) {
      await answer.body?.cancel();
      return undefined as T;
    }
    return (await readJson(answer, options.signal)) as T;
  }
}

async function readJson(answer: Response, signal?: AbortSignal): Promise<unknown> {
  try {
    return await answer.json();
  } catch (error) {
    if (signal?.aborted) throw signal.reason;
    throw new StepwardenError(answer.status, `the answer is not JSON (${describe(error)})`, {
      cause: error,
    });
  }
}

/** The error of an answer that is not 2xx: its status and the server's `error`. */
export async function refusal(answer: Response, what: string): Promise<StepwardenError> {
  let text = "";
  try {
    text = await answer.text();
  } catch {
    // the body could not be read: the status says enough
  }
  let body: unknown;
  let message = text.slice(0, 300);
  try {
    body = JSON.parse(text);
    const said = (body as { error?: unknown } | null)?.error;
    if (typeof said === "string") message = said;
  } catch {
    // not JSON: the text's beginning is the message
  }
  return new StepwardenError(
    answer.status,
    message || `${what}: answered ${answer.status} ${answer.statusText}`,
    { body },
  );
}

/** An error's name and message, for a log or another error's message. */
export function describe(error: unknown): string {
  if (error instanceof Error) {
    const cause = error.cause instanceof Error ? ` (${error.cause.message})` : "";
    return `${error.name}: ${error.message}${cause}`;
  }
  return String(error);
}
