/**
 * A service submitting a task over the application API: it follows the task's status
 * messages as they come, then prints its result.
 *
 *     STEPWARDEN_URL=http://127.0.0.1:8080 STEPWARDEN_TOKEN=sw_... \
 *         node dist/examples/submit.js WORKFLOW INPUT_JSON [TASK_ID]
 *
 * The token is a client's with the scopes submit and read
 * (`stepwarden api-token storefront --scope submit --scope read --append api-tokens`).
 */

import { Client, StepwardenError } from "../src/index.js";

const [workflow, input = "null", taskId] = process.argv.slice(2);
if (workflow === undefined) {
  console.error("usage: submit.js WORKFLOW INPUT_JSON [TASK_ID]");
  process.exit(2);
}
const client = new Client({
  url: process.env.STEPWARDEN_URL ?? "http://127.0.0.1:8080",
  token: process.env.STEPWARDEN_TOKEN ?? "",
});

try {
  // Idempotent by its id: submitted again (an answer lost, a retry), it is the same task.
  const task = await client.submit(workflow, JSON.parse(input), {
    ...(taskId === undefined ? {} : { taskId }),
    replyTo: "updates",
  });
  console.log(`submitted ${task.taskId}`);
  // The status messages, in order; the stream is resumed after a break, and ends once the
  // task has finished.
  for await (const message of task.messages()) {
    console.log(`${message.id} ${message.kind} ${JSON.stringify(message.detail)}`);
  }
  const done = await task.result({ timeoutMs: 60_000 });
  console.log(`${done.state}: ${JSON.stringify(done.state === "processed" ? done.result : done.error)}`);
  process.exitCode = done.state === "processed" ? 0 : 1;
} catch (error) {
  // Refused (a StepwardenError: status and the server's message), or out of reach.
  if (error instanceof StepwardenError) console.error(`refused (${error.status}): ${error.message}`);
  else console.error(error);
  process.exitCode = 1;
}
