import type { components } from "./generated/openapi.js";

/**
 * The JSON the server answers, as its OpenAPI documents describe it
 * (`/api/v1/openapi.json`): field names as the server writes them.
 */

/** Any JSON value: a task's input and result, an event's payload. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

export type TaskState =
  | "pending"
  | "processing"
  | "processed"
  | "error"
  | "compensating"
  | "compensated"
  | "compensation_failed"
  | "paused"
  | "cancelled"
  | "waiting";

/** The states a task ends in (`GET /api/v1/results/{id}` answers at once). */
export const FINISHED_STATES: readonly TaskState[] = [
  "processed",
  "error",
  "compensated",
  "compensation_failed",
  "cancelled",
];

/** `POST /api/v1/tasks`. */
export interface SubmitAnswer {
  task_id: string;
  /** False when a task of this id was submitted before, with the same workflow and input. */
  created: boolean;
}

/** `GET /api/v1/tasks/{id}`: a task's state and what it waits for. */
export interface TaskStatus {
  task_id: string;
  workflow: string;
  version: number;
  state: TaskState;
  finished: boolean;
  priority: number;
  reply_to: string | null;
  parent_id: string | null;
  error: string | null;
  /** A waiting task's: "timer", "event:NAME", "child:ID" or "start". */
  waiting_for: string | null;
  wake_at: string | null;
  created_at: string;
  updated_at: string;
  finished_at: string | null;
}

/** `GET /api/v1/results/{id}` (200): a finished task's outcome. */
export interface TaskResult {
  task_id: string;
  /** processed (`result` is the workflow's), or error, compensated, compensation_failed,
   * cancelled (`error` says why). */
  state: TaskState;
  result: Json;
  error: string | null;
  finished_at: string | null;
}

/** One event of `GET /api/v1/messages/{id}`: a status message of the task. */
export interface StatusMessage {
  /** Unique and rising: the Last-Event-ID to resume after. */
  id: number;
  task_id: string;
  /** received, step_completed, or the state the task entered (processing, processed, ...). */
  kind: string;
  detail: Json;
  at: string;
}

/** `POST /api/v1/events/{id}`. */
export interface SendAnswer {
  /** False when this event_id was sent before. */
  sent: boolean;
  /** The task was waiting for this event and is pending again. */
  woke: boolean;
}

/** `POST /api/v1/cancel/{id}`. */
export interface CancelAnswer {
  outcome: {
    task_id: string;
    applied: boolean;
    before: TaskState | null;
    after: TaskState | null;
    message: string;
  };
}

// -- the agent protocol (/api/v1/agents) ------------------------------------------------------
// Generated from the server's document (openapi.json, `npm run generate`): the wire's own
// field names.

type Schemas = components["schemas"];

/** `GET /api/v1/agents/whoami`: the client, the agents it may serve, and what every runner
 * of the protocol needs to agree on. */
export type WhoAmI = Schemas["WhoAmI"];

/** A claimed request: a step to call, with the fencing token of its writes (task_id, seq,
 * attempt, and the instance that claimed it). Its `input` is the operation's arguments. */
export type ClaimedRequest = Omit<Schemas["RequestModel"], "input"> & { input: Json };

export type OperationLimit = Schemas["OpLimitModel"];
export type CallKey = Schemas["CallKey"];
export type LostCall = Schemas["LostCall"];
export type Outcome = Omit<Schemas["Outcome-Input"], "result"> & { result?: Json };
export type Handback = Schemas["Handback"];
