/**
 * A real stepwarden server and worker for the tests, as separate processes: the application
 * `tests.typescript.ts_app:app` of the repository, an SQLite store in a new folder, clients
 * made with `stepwarden api-token`. The dashboard serves the application API and the agent
 * protocol (its port a free one, read from what it prints); the worker runs the scheduler,
 * the supervisor and the agent `local` (`shipping` is the TypeScript agent's).
 *
 * The Python is STEPWARDEN_PYTHON, else the repository's .venv, else python3; the
 * repository's own src/ and root come first on its PYTHONPATH.
 */

import { execFile, spawn, type ChildProcess } from "node:child_process";
import { existsSync, openSync, closeSync, readFileSync } from "node:fs";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { delimiter, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const run = promisify(execFile);

/** The repository's root: STEPWARDEN_REPOSITORY, else the one this file was compiled in
 * (clients/typescript/dist/test/stack.js). */
export const ROOT = process.env.STEPWARDEN_REPOSITORY || fileURLToPath(new URL("../../../../", import.meta.url));
/** The compiled examples, beside the compiled tests: an agent, and a client. */
export const AGENT_EXAMPLE = fileURLToPath(new URL("../examples/shipping.js", import.meta.url));
export const SUBMIT_EXAMPLE = fileURLToPath(new URL("../examples/submit.js", import.meta.url));
export const APP = "tests.typescript.ts_app:app";
export const DASHBOARD_TOKEN = "dashboard-token-ts-6d1f0a";
/** How long a test waits for what it expects, in milliseconds. */
export const TIMEOUT = 20_000;

export function python(): string {
  const given = process.env.STEPWARDEN_PYTHON;
  if (given) return given;
  const venv = join(ROOT, ".venv", "bin", "python");
  return existsSync(venv) ? venv : "python3";
}

/** The environment of the stack's processes: none of the command line's variables. */
export function processEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [name, value] of Object.entries(process.env)) {
    if (!name.startsWith("STEPWARDEN_")) env[name] = value;
  }
  const path = [join(ROOT, "src"), ROOT, process.env.PYTHONPATH].filter(Boolean).join(delimiter);
  return { ...env, PYTHONPATH: path, PYTHONUNBUFFERED: "1", ...extra };
}

export interface Stack {
  /** The server's base URL. */
  url: string;
  /** Each client's token. */
  tokens: Record<string, string>;
  dir: string;
  dashboard: ChildProcess;
  worker: ChildProcess;
  /** The end of the processes' logs (for a failure's message). */
  logs(): string;
  /** Stop the dashboard (SIGTERM) and start another on its port; once it answers. */
  restartDashboard(): Promise<void>;
  /** SIGTERM both, wait for them to end; the folder is removed. */
  stop(): Promise<void>;
}

/** A new client's token, its line appended to a tokens file of its own (`NAME.tokens`). */
async function token(dir: string, name: string, scopes: string[]): Promise<string> {
  const args = ["-m", "stepwarden", "api-token", name, "--append", join(dir, `${name}.tokens`)];
  // A scope, or a setting (SETTING=VALUE) of the client's line.
  for (const scope of scopes) args.push(scope.includes("=") ? "--set" : "--scope", scope);
  const { stdout } = await run(python(), args, { cwd: ROOT, env: processEnv() });
  const found = /\bsw_[A-Za-z0-9_-]{20,}/.exec(stdout);
  if (found === null) throw new Error(`stepwarden api-token printed no token: ${stdout}`);
  return found[0];
}

function ended(child: ChildProcess, ms: number): Promise<boolean> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve(true);
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), ms);
    child.once("exit", () => {
      clearTimeout(timer);
      resolve(true);
    });
  });
}

async function terminate(child: ChildProcess): Promise<void> {
  child.kill("SIGTERM");
  if (!(await ended(child, 15_000))) {
    child.kill("SIGKILL");
    await ended(child, 5_000);
  }
}

/** Start the server and the worker, with these clients (name: scopes and settings). */
export async function startStack(clients: Record<string, string[]>): Promise<Stack> {
  const dir = await mkdtemp(join(tmpdir(), "stepwarden-ts-"));
  // Made at once, each in a file of its own; the server's file holds their lines.
  const names = Object.keys(clients);
  const made = await Promise.all(names.map((name) => token(dir, name, clients[name]!)));
  const tokens = Object.fromEntries(names.map((name, i) => [name, made[i]!]));
  const lines = await Promise.all(names.map((name) => readFile(join(dir, `${name}.tokens`), "utf8")));
  await writeFile(join(dir, "api-tokens"), lines.join(""), { mode: 0o600 });
  const store = `sqlite:///${join(dir, "store.db")}`;
  const logPath = (name: string): string => join(dir, `${name}.log`);
  const children = new Set<ChildProcess>();
  const start = (name: string, args: string[], stdout: "pipe" | "log"): ChildProcess => {
    const log = openSync(logPath(name), "a");
    const child = spawn(python(), ["-m", "stepwarden", "--store", store, ...args], {
      cwd: ROOT,
      env: processEnv(),
      stdio: ["ignore", stdout === "pipe" ? "pipe" : log, log],
    });
    closeSync(log);
    children.add(child);
    return child;
  };
  const logs = (): string =>
    ["dashboard", "worker"]
      .map((name) => {
        const text = existsSync(logPath(name)) ? readFileSync(logPath(name), "utf8") : "";
        return `--- ${name} ---\n${text.slice(-4000)}`;
      })
      .join("\n");
  const stop = async (): Promise<void> => {
    await Promise.all([...children].map(terminate));
    if (process.env.STEPWARDEN_TEST_KEEP) console.error(`kept ${dir}`);
    else await rm(dir, { recursive: true, force: true });
  };
  /** The dashboard on `port` (0: a free one), and its URL once it answers. */
  const serve = async (port: number): Promise<[ChildProcess, string]> => {
    const dashboard = start(
      "dashboard",
      ["dashboard", APP, "--port", String(port), "--token", DASHBOARD_TOKEN, "--api-tokens", join(dir, "api-tokens")],
      "pipe",
    );
    const url = await new Promise<string>((resolve, reject) => {
      const lines = createInterface({ input: dashboard.stdout! });
      const timer = setTimeout(() => reject(new Error(`the dashboard printed no URL\n${logs()}`)), TIMEOUT);
      lines.once("line", (line) => {
        clearTimeout(timer);
        resolve(line.trim().split(" ").pop()!.replace(/\/+$/, ""));
      });
      dashboard.once("exit", (code) => reject(new Error(`the dashboard ended (${code})\n${logs()}`)));
    });
    dashboard.stdout!.resume(); // what else it prints is not read
    // Until the server answers (its URL is printed before it serves).
    const until = performance.now() + TIMEOUT;
    for (;;) {
      try {
        const answer = await fetch(`${url}/api/v1/openapi.json`);
        await answer.body?.cancel();
        if (answer.ok) break;
      } catch {
        // not serving yet
      }
      if (performance.now() > until) throw new Error(`the dashboard did not answer\n${logs()}`);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    return [dashboard, url];
  };
  try {
    const worker = start(
      "worker",
      [
        "worker", APP, "--agents", "local",
        "--poll-interval", "0.05", "--supervisor-interval", "0.2",
        "--agent-heartbeat", "0.2", "--drain-timeout", "5",
      ],
      "log",
    );
    const [dashboard, url] = await serve(0);
    const stack: Stack = {
      url,
      tokens,
      dir,
      dashboard,
      worker,
      logs,
      stop,
      restartDashboard: async () => {
        await terminate(stack.dashboard);
        children.delete(stack.dashboard);
        [stack.dashboard] = await serve(Number(new URL(url).port));
      },
    };
    return stack;
  } catch (error) {
    await stop();
    throw error;
  }
}

/** Poll `check` (every 20 ms) until it returns something truthy; that value. */
export async function until<T>(what: string, check: () => T | Promise<T>, ms = TIMEOUT): Promise<NonNullable<T>> {
  const deadline = performance.now() + ms;
  for (;;) {
    const value = await check();
    if (value) return value as NonNullable<T>;
    if (performance.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

export interface Deferred<T> {
  promise: Promise<T>;
  resolve: (value: T) => void;
}

/** A promise and its resolve, to wait for what another part of the test does. */
export function deferred<T = void>(): Deferred<T> {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

/** A read of the dashboard's own JSON API (the step states, the registry). */
export async function dashboardGet<T>(stack: Stack, path: string): Promise<T> {
  const answer = await fetch(stack.url + path, { headers: { Authorization: `Bearer ${DASHBOARD_TOKEN}` } });
  if (!answer.ok) throw new Error(`GET ${path}: ${answer.status} ${await answer.text()}`);
  return (await answer.json()) as T;
}
