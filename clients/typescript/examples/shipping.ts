/**
 * An agent in TypeScript: it serves the `shipping` agent's operation `ship` over the agent
 * protocol of a stepwarden server, until SIGTERM (or SIGINT), then stops gracefully: it
 * claims no more, lets the calls under way finish, hands back what it claimed and has not
 * started, and leaves the registry.
 *
 *     STEPWARDEN_URL=http://127.0.0.1:8080 STEPWARDEN_AGENT_TOKEN=sw_... \
 *         node dist/examples/shipping.js
 *
 * The token is a client's with the scope agent:shipping
 * (`stepwarden api-token shipper --scope agent:shipping --append api-tokens`).
 */

import { Agent, PermanentError, type Call } from "../src/index.js";

interface Order {
  id: string;
  items?: string[];
  address?: string;
}

/** Ship an order: its idempotency key names the shipment, so that a retry or a second
 * dispatch of the step books it once at the courier. */
async function ship(call: Call, order: Order): Promise<{ tracking: string; items: string[] | number }> {
  if (order.address === "nowhere") {
    throw new PermanentError(`no courier delivers order ${order.id}`);
  }
  // A real courier's API would be called here, with call.signal and call.idempotencyKey:
  //   await fetch(url, {method: "POST", signal: call.signal,
  //                     headers: {"Idempotency-Key": call.idempotencyKey}, ...})
  return { tracking: `T-${call.idempotencyKey}`, items: order.items ?? [] };
}

const url = process.env.STEPWARDEN_URL ?? "http://127.0.0.1:8080";
const token = process.env.STEPWARDEN_AGENT_TOKEN ?? "";
const agent = new Agent({
  url,
  token,
  agent: "shipping",
  operations: { ship },
  concurrency: Number(process.env.SHIPPING_CONCURRENCY ?? 10),
  onRegistered: (instance) => console.log(`serving shipping as ${instance} at ${url}`),
});

const stop = new AbortController();
for (const signal of ["SIGTERM", "SIGINT"] as const) {
  process.once(signal, () => {
    console.log(`${signal}: stopping`);
    stop.abort();
  });
}

try {
  await agent.run(stop.signal);
  console.log("stopped");
} catch (error) {
  console.error(`cannot serve shipping: ${error instanceof Error ? error.message : String(error)}`);
  process.exitCode = 1;
}
