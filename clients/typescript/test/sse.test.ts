/**
 * The server-sent events parser, on bytes cut anywhere: line ends of every kind (a CRLF
 * split between two chunks is one end), comments, multi-line data, ids that persist, the
 * retry field, a byte-order mark, a character split between chunks, an unfinished event.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { parseServerSentEvents, type ServerSentEvent } from "../src/index.js";

function stream(chunks: Array<string | Uint8Array>): ReadableStream<Uint8Array> {
  const encoder = new TextEncoder();
  return new ReadableStream({
    start(controller) {
      for (const chunk of chunks) controller.enqueue(typeof chunk === "string" ? encoder.encode(chunk) : chunk);
      controller.close();
    },
  });
}

async function collect(chunks: Array<string | Uint8Array>, retries: number[] = []): Promise<ServerSentEvent[]> {
  const found: ServerSentEvent[] = [];
  for await (const event of parseServerSentEvents(stream(chunks), { onRetry: (ms) => retries.push(ms) })) {
    found.push(event);
  }
  return found;
}

/** Every way of cutting `text` in two. */
function cuts(text: string): Array<[string, string]> {
  return Array.from({ length: text.length + 1 }, (_, i) => [text.slice(0, i), text.slice(i)]);
}

test("events, comments, data lines and ids, cut anywhere", async () => {
  const text =
    "\uFEFFretry: 2000\r\n\r\n" +
    ": a comment\n" +
    "id: 1\nevent: received\ndata: {\"a\":1}\n\n" +
    "id: 2\r\nevent: step_completed\r\ndata:first\r\ndata: second\r\n\r\n" +
    "data: no id of its own\rdata\r\r" +
    "event: unfinished\ndata: dropped\n";
  for (const [head, tail] of cuts(text)) {
    const retries: number[] = [];
    const found = await collect([head, tail], retries);
    assert.deepEqual(
      found,
      [
        { event: "received", data: '{"a":1}', id: "1" },
        { event: "step_completed", data: "first\nsecond", id: "2" },
        { event: "message", data: "no id of its own\n", id: "2" },
      ],
      `cut at ${head.length}`,
    );
    assert.deepEqual(retries, [2000]);
  }
});

test("a character cut between chunks, an id with NUL, fields it does not know", async () => {
  const bytes = new TextEncoder().encode("id: 7\ndata: caf\u00e9 \u2713\nid: bad\u0000id\nfoo: bar\nretry: soon\n\n");
  const at = bytes.indexOf(0xc3) + 1; // inside the é
  const found = await collect([bytes.slice(0, at), bytes.slice(at)]);
  assert.deepEqual(found, [{ event: "message", data: "caf\u00e9 \u2713", id: "7" }]);
});

test("a blank line without data dispatches nothing; a stream may end at once", async () => {
  assert.deepEqual(await collect(["event: nothing\n\n", "\n\n"]), []);
  assert.deepEqual(await collect([]), []);
});
