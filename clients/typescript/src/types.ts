import type { components } from "./generated/openapi.js";

/**
 * What the server answers. The application API's answers in camelCase, as the `Client`
 * gives them; the agent protocol's as the server writes them (its wire's own names,
 * generated from its OpenAPI document, `/api/v1/openapi.json`).
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

/** A task's state and what it waits for (`GET /api/v1/tasks/{id}`), in camelCase, its times
 * as `Date`s. */
export interface TaskStatus {
  taskId: string;
  workflow: string;
  version: number;
  state: TaskState;
  finished: boolean;
  priority: number;
  replyTo: string | null;
  parentId: string | null;
  /** Who the task belongs to (null: none). */
  tenant: string | null;
  error: string | null;
  /** A waiting task's: "timer", "event:NAME", "child:ID" or "start". */
  waitingFor: string | null;
  wakeAt: Date | null;
  createdAt: Date;
  updatedAt: Date;
  finishedAt: Date | null;
}

/** A finished task's outcome (`GET /api/v1/results/{id}`). */
export interface TaskResult {
  taskId: string;
  /** processed (`result` is the workflow's), or error, compensated, compensation_failed,
   * cancelled (`error` says why). */
  state: TaskState;
  result: Json;
  error: string | null;
  finishedAt: Date | null;
}

/** One status message of the task (`GET /api/v1/messages/{id}`). */
export interface StatusMessage {
  /** Unique and rising: the `lastEventId` to resume after. */
  id: number;
  taskId: string;
  /** received, step_completed, or the state the task entered (processing, processed, ...). */
  kind: string;
  detail: Json;
  at: Date;
}

/** `POST /api/v1/events/{id}`. */
export interface SendAnswer {
  /** False when this eventId was sent before, whatever the task's state now. */
  sent: boolean;
  /** The task was waiting for this event and is pending again. */
  woke: boolean;
}

/** What a cancel did (`POST /api/v1/cancel/{id}`). */
export interface CancelOutcome {
  taskId: string;
  /** False when the task had finished already: nothing changed. */
  applied: boolean;
  before: TaskState | null;
  after: TaskState | null;
  message: string;
}

/** The application API's answers as the server writes them (generated from its document). */
export type Wire = {
  SubmitAnswer: components["schemas"]["SubmitAnswer"];
  TaskStatus: components["schemas"]["TaskStatus"];
  TaskResult: components["schemas"]["TaskResult"];
  StatusMessage: components["schemas"]["StatusMessage"];
  SendAnswer: components["schemas"]["SendAnswer"];
  OutcomeAnswer: components["schemas"]["OutcomeAnswer"];
  SubmitRequest: components["schemas"]["SubmitRequest"];
};

const date = (text: string): Date => new Date(text);
const maybeDate = (text: string | null | undefined): Date | null => (text == null ? null : new Date(text));

/** @internal */
export function taskStatus(w: Wire["TaskStatus"]): TaskStatus {
  return {
    taskId: w.task_id,
    workflow: w.workflow,
    version: w.version,
    state: w.state,
    finished: w.finished,
    priority: w.priority,
    replyTo: w.reply_to,
    parentId: w.parent_id,
    tenant: w.tenant,
    error: w.error,
    waitingFor: w.waiting_for,
    wakeAt: maybeDate(w.wake_at),
    createdAt: date(w.created_at),
    updatedAt: date(w.updated_at),
    finishedAt: maybeDate(w.finished_at),
  };
}

/** @internal */
export function taskResult(w: Wire["TaskResult"]): TaskResult {
  return {
    taskId: w.task_id,
    state: w.state,
    result: (w.result ?? null) as Json,
    error: w.error,
    finishedAt: maybeDate(w.finished_at),
  };
}

/** @internal */
export function statusMessage(w: Wire["StatusMessage"]): StatusMessage {
  return { id: w.id, taskId: w.task_id, kind: w.kind, detail: (w.detail ?? null) as Json, at: date(w.at) };
}

/** @internal */
export function cancelOutcome(taskId: string, w: Wire["OutcomeAnswer"]): CancelOutcome {
  const o = w.outcome;
  return {
    taskId: o.task_id ?? taskId,
    applied: o.applied,
    before: (o.before ?? null) as TaskState | null,
    after: (o.after ?? null) as TaskState | null,
    message: o.message,
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
export type Outcome = Omit<Schemas["OutcomeModel"], "result"> & { result?: Json };
export type Handback = Schemas["Handback"];
