// A program written against the types openapi-typescript generates from the application
// API's OpenAPI document (./schema.js, beside it at test time), calling it with
// openapi-fetch: submit a task of `approval`, long-poll its result (not finished: 202, its
// status), send it the event `approve`, long-poll again until it has finished. It prints
// what it saw as one JSON line; tests/openapi/test_generated_clients.py checks it.
import createClient from "openapi-fetch";
import type { components, paths } from "./schema.js";

type TaskResult = components["schemas"]["TaskResult"];
type TaskStatus = components["schemas"]["TaskStatus"];

function given(name: string): string {
  const value = process.env[name];
  if (value === undefined) throw new Error(`${name} is not set`);
  return value;
}

const taskId = given("TASK_ID");
const client = createClient<paths>({
  baseUrl: given("STEPWARDEN_URL"),
  headers: { Authorization: `Bearer ${given("STEPWARDEN_TOKEN")}` },
});

const made = await client.POST("/api/v1/tasks", {
  body: { workflow: "approval", input: 7, task_id: taskId },
});
if (made.error !== undefined) throw new Error(`submit: ${JSON.stringify(made.error)}`);

const early = await client.GET("/api/v1/results/{task_id}", {
  params: { path: { task_id: taskId }, query: { timeout: 1 } },
});
if (early.error !== undefined) throw new Error(`result: ${JSON.stringify(early.error)}`);
const earlyStatus = early.response.status;
const status = early.data as TaskStatus;

const sent = await client.POST("/api/v1/events/{task_id}", {
  params: { path: { task_id: taskId } },
  body: { name: "approve", payload: "ana", event_id: `${taskId}-approve` },
});
if (sent.error !== undefined) throw new Error(`event: ${JSON.stringify(sent.error)}`);

let result: TaskResult | undefined;
const deadline = Date.now() + 60_000;
while (result === undefined) {
  const polled = await client.GET("/api/v1/results/{task_id}", {
    params: { path: { task_id: taskId }, query: { timeout: 20 } },
  });
  if (polled.error !== undefined) throw new Error(`result: ${JSON.stringify(polled.error)}`);
  if (polled.response.status === 200) result = polled.data as TaskResult;
  else if (Date.now() > deadline) throw new Error("the task did not finish within 60 s");
}

console.log(
  JSON.stringify({
    submitted: { status: made.response.status, task_id: made.data.task_id },
    early: { status: earlyStatus, state: status.state, finished: status.finished },
    sent: sent.data,
    result: { state: result.state, result: result.result, error: result.error },
  }),
);
