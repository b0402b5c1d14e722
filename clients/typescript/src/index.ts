/**
 * stepwarden for TypeScript and JavaScript: the application API's client (`Client`) and an
 * agent runner (`Agent`) that serves an agent's operations over the agent protocol.
 */

export { Client, TaskHandle } from "./client.js";
export type { CancelOptions, MessagesOptions, ResultOptions, SubmitOptions } from "./client.js";
export { Agent, Call } from "./agent.js";
export type {
  AgentOptions,
  Logger,
  OperationFunction,
  OperationLimitOptions,
  OperationOptions,
  RetryOptions,
} from "./agent.js";
export { AgentProtocol } from "./protocol.js";
export type { AnswerOf, BeatBody, BodyOf, ClaimBody, Wakeup } from "./protocol.js";
export type { BreakerOptions, BreakerState } from "./breaker.js";
export {
  ConfigurationError,
  PermanentError,
  ResultTimeoutError,
  StepLostError,
  StepwardenError,
} from "./errors.js";
export type { ServerOptions } from "./http.js";
export { parseServerSentEvents } from "./sse.js";
export type { ServerSentEvent } from "./sse.js";
export { FINISHED_STATES } from "./types.js";
export type * from "./types.js";
