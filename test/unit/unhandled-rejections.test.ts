// A database server that resets a connection while postgres.js fetches its array types leaves a
// rejection nobody handles; Bun ends the process for it. Kiln logs that one and goes on (a database
// outage of the production profile is not a crash), and still exits on any other unhandled rejection.
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { describe, expect, test } from "vitest";

const ROOT = join(import.meta.dirname, "../..");
const BUN = join(ROOT, "node_modules/.bin/bun");

/** Runs a script in its own Bun process, with or without Kiln's handler installed. */
function run(guarded: boolean, body: string) {
  const script = `
    import net from "node:net";
    import postgres from ${JSON.stringify(join(ROOT, "node_modules/postgres/src/index.js"))};
    const { handleUnhandledRejections } = await import(${JSON.stringify(join(ROOT, "server/unhandled-rejections.ts"))});
    const { createLogger } = await import(${JSON.stringify(join(ROOT, "server/log.ts"))});
    if (${guarded}) handleUnhandledRejections(createLogger());
    // After the module has run, as in a server (Bun holds back a rejection during top-level await).
    setTimeout(async () => {
      ${body}
      await new Promise((r) => setTimeout(r, 300));
      console.log("still running");
      process.exit(0);
    });`;
  const r = spawnSync(BUN, ["-e", script], { cwd: ROOT, encoding: "utf8", timeout: 20_000 });
  return { code: r.status, out: r.stdout, err: r.stderr };
}

/** A server that says it is ready, then resets the connection at the client's first statement: its array-type fetch. */
const resettingServer = `
  const msg = (t, body) => { const h = Buffer.alloc(5); h.write(t, 0); h.writeInt32BE(body.length + 4, 1); return Buffer.concat([h, body]); };
  let statements = 0;
  const srv = net.createServer((s) => {
    let started = false;
    s.on("data", () => {
      if (!started) { started = true; s.write(Buffer.concat([msg("R", Buffer.alloc(4)), msg("Z", Buffer.from("I"))])); return; }
      statements++;
      s.resetAndDestroy();
    });
  });
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  const sql = postgres({ host: "127.0.0.1", port: srv.address().port, user: "u", database: "d", max: 1 });
  const failed = await sql\`select 1\`.then(() => "", (e) => e.code);
  console.log("query failed with " + failed + " after " + statements + " statement(s)");
  sql.end({ timeout: 0 });
  srv.close();`;

describe("unhandled rejections", () => {
  test("a connection reset during postgres.js's type fetch: Bun alone ends the process, Kiln's handler logs it and goes on", () => {
    const bare = run(false, resettingServer);
    expect(bare.out).toContain("query failed with ECONNRESET after 1 statement(s)");
    expect(bare.out).not.toContain("still running");
    expect(bare.code).not.toBe(0);

    const guarded = run(true, resettingServer);
    expect(guarded.out).toContain("query failed with ECONNRESET after 1 statement(s)");
    expect(guarded.out).toContain("still running");
    expect(guarded.err).toMatch(/warn {2}a background database connection was lost \(ECONNRESET/);
    expect(guarded.code).toBe(0);
  });

  test("any other unhandled rejection still ends Kiln, with exit 1 and the error's stack", () => {
    const r = run(true, `Promise.reject(new Error("a bug somewhere"));`);
    expect(r.out).not.toContain("still running");
    expect(r.err).toContain("unhandled promise rejection; exiting: Error: a bug somewhere");
    expect(r.code).toBe(1);
  });
});
