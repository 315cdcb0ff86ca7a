// Reads a Server-Sent Events stream (the logs tail, GET /projects/{id}/logs/tail) with fetch: an
// EventSource cannot send the Authorization header. Used by the CLI (cmd/commands/log-stream.ts) and
// the console (server/console/app/tail.ts); no imports, so it bundles for the browser too.

/**
 * Calls `onEvent` per event (its name, data lines joined, and `id:` when it has one) until the stream
 * ends (or its request is aborted), and `onChunk` after the events of each chunk read (a batch).
 * Comment lines (`:`) are skipped. What a callback throws ends the reading with that error.
 */
export async function readEvents(res: Response, onEvent: (name: string, data: string, id?: string) => void, onChunk?: () => void): Promise<void> {
  const reader = res.body!.getReader();
  const dec = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += dec.decode(value, { stream: true });
    let i: number;
    while ((i = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, i);
      buffer = buffer.slice(i + 2);
      let name = "message";
      let id: string | undefined;
      const data: string[] = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
        else if (line.startsWith("id:")) id = line.slice(3).trim();
      }
      if (data.length) onEvent(name, data.join("\n"), id);
    }
    onChunk?.();
  }
}
