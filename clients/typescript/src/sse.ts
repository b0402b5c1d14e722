/**
 * Server-sent events (text/event-stream), parsed as the HTML standard says: lines end with
 * CRLF, LF or CR; a line starting with `:` is a comment; `field: value` (one space after the
 * colon dropped) sets `event`, `data` (lines joined with LF), `id` or `retry`; a blank line
 * dispatches the event, when it has data. The last `id` seen stays the stream's last event
 * id until another one comes.
 */

/** One event dispatched. */
export interface ServerSentEvent {
  /** The event's type (`message` when the stream named none). */
  event: string;
  /** Its data lines, joined with LF. */
  data: string;
  /** The stream's last event id, as of this event (undefined: none was sent yet). */
  id: string | undefined;
}

export interface ParseOptions {
  /** Called with each `retry:` the stream sends (milliseconds before a reconnection). */
  onRetry?: (milliseconds: number) => void;
}

/** The lines of a stream of bytes (UTF-8), without their ends, as they arrive. */
async function* lines(body: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  const decoder = new TextDecoder("utf-8");
  const reader = body.getReader();
  let buffer = "";
  let first = true;
  let afterCR = false; // the last chunk ended with CR: an LF starting the next one is its end
  try {
    for (;;) {
      const { done, value } = await reader.read();
      let text = done ? decoder.decode() : decoder.decode(value, { stream: true });
      if (first && text.length > 0) {
        first = false;
        if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
      }
      if (afterCR && text.startsWith("\n")) text = text.slice(1);
      if (text.length > 0) afterCR = false;
      buffer += text;
      let start = 0;
      for (let i = 0; i < buffer.length; i++) {
        const c = buffer.charCodeAt(i);
        if (c !== 10 && c !== 13) continue;
        yield buffer.slice(start, i);
        if (c === 13) {
          if (i + 1 < buffer.length) {
            if (buffer.charCodeAt(i + 1) === 10) i++;
          } else {
            afterCR = true;
          }
        }
        start = i + 1;
      }
      buffer = buffer.slice(start);
      if (done) return; // an unfinished last line is dropped, as the standard says
    }
  } finally {
    // The consumer stopped early, or the stream failed: the connection is let go.
    await reader.cancel().catch(() => undefined);
    reader.releaseLock();
  }
}

/**
 * The events of a text/event-stream body, as they arrive. Ends when the body ends (an event
 * not closed by a blank line is dropped); throws what reading the body throws (a broken
 * connection, an abort).
 */
export async function* parseServerSentEvents(
  body: ReadableStream<Uint8Array>,
  options: ParseOptions = {},
): AsyncGenerator<ServerSentEvent> {
  let lastId: string | undefined;
  let event = "";
  let data: string[] = [];
  for await (const line of lines(body)) {
    if (line === "") {
      if (data.length > 0) {
        yield { event: event || "message", data: data.join("\n"), id: lastId };
      }
      event = "";
      data = [];
      continue;
    }
    if (line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    switch (field) {
      case "event":
        event = value;
        break;
      case "data":
        data.push(value);
        break;
      case "id":
        if (!value.includes("\u0000")) lastId = value;
        break;
      case "retry":
        if (/^[0-9]+$/.test(value)) options.onRetry?.(Number(value));
        break;
      default:
        break; // a field the standard does not know is ignored
    }
  }
}
