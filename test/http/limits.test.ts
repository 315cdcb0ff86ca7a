// Bounded memory per request: body limits enforced while the body arrives (413 before it is all
// sent), JSON nesting refused before parsing (400), out-of-range timestamps refused (400). Memory is
// read from the Kiln process itself (/proc/<pid>/status), with its peak reset before each case.
import { readFileSync, writeFileSync } from "node:fs";
import { request as httpRequest } from "node:http";
import { connect } from "node:net";
import { describe, expect, test } from "vitest";
import { deploy, tgz } from "../support/functions";
import { createProject, eventually, PRODUCT_ALLOCATOR, useKiln, withKiln, type TestKiln } from "../support/kiln";

const MB = 1_048_576;

function status(pid: number): { rss: number; hwm: number } {
  const s = readFileSync(`/proc/${pid}/status`, "utf8");
  const kb = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, "m").exec(s)?.[1] ?? NaN) * 1024;
  return { rss: kb("VmRSS"), hwm: kb("VmHWM") };
}

/** How far the process's resident memory rose above where it started while `fn` ran (its peak, VmHWM). */
async function peakGrowth<T>(k: TestKiln, fn: () => Promise<T>): Promise<{ growthMb: number; result: T }> {
  const pid = k.proc.pid!;
  try {
    writeFileSync(`/proc/${pid}/clear_refs`, "5"); // resets VmHWM to the current RSS
  } catch {
    // Older kernels: the peak then includes start-up, which only makes the check looser.
  }
  const before = status(pid).rss;
  const result = await fn();
  await new Promise((r) => setTimeout(r, 200));
  if (process.env.KILN_TEST_SHOW_MEMORY) console.log(`rss before ${before / MB} MB, peak ${status(pid).hwm / MB} MB`);
  return { growthMb: (status(pid).hwm - before) / MB, result };
}

interface Answer {
  status: number;
  text: string;
  body: any;
  /** Body bytes handed to the client before the answer came (buffered writes included). */
  sent: number;
  ms: number;
}

/**
 * POSTs a body of `total` bytes made of `chunk` repeated (after `prefix`), chunked or with its length
 * declared, and stops writing as soon as an answer arrives (or the server hangs up).
 */
function post(
  k: TestKiln,
  path: string,
  o: { headers?: Record<string, string>; prefix?: string; chunk: Buffer; total: number; declare?: boolean; timeoutMs?: number },
): Promise<Answer> {
  const started = Date.now();
  return new Promise<Answer>((resolve, reject) => {
    let sent = 0;
    let answered = false;
    const headers: Record<string, string | number> = { "content-type": "application/json", ...o.headers };
    if (o.declare) headers["content-length"] = o.total;
    else headers["transfer-encoding"] = "chunked";
    const req = httpRequest(`${k.url}${path}`, { method: "POST", headers });
    const timer = setTimeout(() => {
      req.destroy();
      reject(new Error(`no answer in ${o.timeoutMs ?? 15_000} ms after ${sent} bytes`));
    }, o.timeoutMs ?? 15_000);
    req.on("response", (res) => {
      answered = true;
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (d) => (text += d));
      res.on("end", () => {
        clearTimeout(timer);
        let body: any;
        try {
          body = JSON.parse(text);
        } catch {}
        resolve({ status: res.statusCode!, text, body, sent, ms: Date.now() - started });
        req.destroy();
      });
    });
    req.on("error", (err) => {
      // Writing into a connection the server closed after answering is expected; no answer is not.
      // (A loaded machine can take a while to deliver the answer after the write failed.)
      if (!answered) setTimeout(() => !answered && (clearTimeout(timer), reject(err)), 5000);
    });
    (async () => {
      if (o.prefix) {
        req.write(o.prefix);
        sent += Buffer.byteLength(o.prefix);
      }
      while (!answered && !req.destroyed && sent < o.total) {
        const piece = o.total - sent >= o.chunk.length ? o.chunk : o.chunk.subarray(0, o.total - sent);
        const ok = req.write(piece);
        sent += piece.length;
        if (!ok) await new Promise((r) => { req.once("drain", r); setTimeout(r, 50); });
      }
      if (!answered && !req.destroyed) req.end();
    })().catch(() => {});
  });
}

/** Sends the head and the first bytes of a body declared much larger, then waits without sending more. */
function declaredThenStall(k: TestKiln, path: string, headers: Record<string, string>, declared: number): Promise<{ status: number; text: string }> {
  const u = new URL(k.url);
  return new Promise((resolve, reject) => {
    const sock = connect(Number(u.port), u.hostname);
    let data = "";
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new Error(`no answer in 10 s: ${data}`));
    }, 10_000);
    sock.on("connect", () => {
      const head = [`POST ${path} HTTP/1.1`, `Host: ${u.host}`, "Content-Type: application/json", `Content-Length: ${declared}`, ...Object.entries(headers).map(([h, v]) => `${h}: ${v}`), "", ""].join("\r\n");
      sock.write(head);
      sock.write("[" + "0,".repeat(32_000));
    });
    sock.on("data", (d) => {
      data += d;
      const end = data.indexOf("\r\n\r\n");
      if (end < 0) return;
      const length = Number(/content-length: (\d+)/i.exec(data.slice(0, end))?.[1] ?? 0);
      if (data.length - end - 4 >= length) {
        clearTimeout(timer);
        sock.destroy();
        resolve({ status: Number(data.slice(9, 12)), text: data.slice(end + 4) });
      }
    });
    sock.on("error", () => {});
  });
}

const zeros = (n: number) => Buffer.from("0,".repeat(n / 2));

describe("request body limits", () => {
  // Measures Kiln's memory: the allocator as users run it.
  const k = useKiln({ env: PRODUCT_ALLOCATOR });
  let project: { id: string };
  let anon: string;
  /** An anon key that may invoke: the invoke route authorizes before it reads a body. */
  let invoker: string;
  let sk: string;
  const setup = async () => {
    if (project) return;
    project = await createProject(k);
    anon = (await k.api("GET", `/projects/${project.id}/anon-keys`)).body.data[0].key;
    sk = (await k.api("POST", `/projects/${project.id}/service-keys`, { body: { name: "limits" } })).body.key;
    invoker = (await k.api("POST", `/projects/${project.id}/anon-keys`, { body: { name: "invoker", permissions: ["functions.invoke"] } })).body.key;
  };

  test("a JSON body declared larger than 1 MiB is a 413 naming the limit, answered before the body is sent", async () => {
    await setup();
    const { growthMb, result } = await peakGrowth(k, () => declaredThenStall(k, "/projects", { Authorization: `Bearer ${k.token}` }, 20_000_000));
    expect(result.status).toBe(413);
    expect(JSON.parse(result.text)).toEqual({ error: "request body too large: JSON request bodies may be at most 1 MiB (1048576 bytes, KILN_MAX_JSON_BODY_BYTES)" });
    expect(growthMb).toBeLessThan(64);
  });

  test("a 10-million-element array to /auth/signup with the anon key: 413, declared or streamed, memory flat", async () => {
    await setup();
    const declared = await peakGrowth(k, () => post(k, "/auth/signup", { headers: { authorization: `Bearer ${anon}` }, prefix: "[", chunk: zeros(1 << 16), total: 20_000_000, declare: true }));
    expect(declared.result.status).toBe(413);
    expect(declared.result.body.error).toMatch(/1 MiB/);
    expect(declared.growthMb).toBeLessThan(64);
    // Streamed without a length: cut off once past the limit, answered before the client is done.
    const streamed = await peakGrowth(k, () => post(k, "/auth/signup", { headers: { authorization: `Bearer ${anon}` }, prefix: "[", chunk: zeros(1 << 16), total: 200_000_000 }));
    expect(streamed.result.status).toBe(413);
    expect(streamed.result.body.error).toMatch(/KILN_MAX_JSON_BODY_BYTES/);
    expect(streamed.growthMb).toBeLessThan(64);
  });

  test("a 100 MB text value streamed to the query API with the anon key is cut off at the limit", async () => {
    await setup();
    const { growthMb, result } = await peakGrowth(k, () =>
      post(k, "/databases/notes/query/insert", { headers: { authorization: `Bearer ${anon}` }, prefix: '{"table":"notes","values":{"body":"', chunk: Buffer.from("x".repeat(1 << 16)), total: 100_000_000 }),
    );
    expect(result.status).toBe(413);
    expect(growthMb).toBeLessThan(64);
  });

  test("a body above every route's limit is refused by the server itself, unread", async () => {
    const r = await declaredThenStall(k, "/projects", { Authorization: `Bearer ${k.token}` }, 500_000_000);
    expect(r.status).toBe(413);
  });

  test("an invocation payload over 6 MiB is a 413 at once (RPC route, declared or streamed)", async () => {
    await setup();
    const fnId = "doesnotmatter00000000";
    const declared = await post(k, `/functions/${fnId}/invoke`, { headers: { authorization: `Bearer ${invoker}` }, prefix: '{"payload":"', chunk: Buffer.from("p".repeat(1 << 16)), total: 7_000_000, declare: true });
    expect(declared.status).toBe(413);
    expect(declared.body.error).toBe("request body too large: function invocation requests may be at most 6 MiB (6291456 bytes, KILN_MAX_INVOKE_BODY_BYTES)");
    expect(declared.ms).toBeLessThan(5000);
    const { growthMb, result: streamed } = await peakGrowth(k, () =>
      post(k, `/functions/${fnId}/invoke`, { headers: { authorization: `Bearer ${invoker}` }, prefix: '{"payload":"', chunk: Buffer.from("p".repeat(1 << 16)), total: 200_000_000 }),
    );
    expect(streamed.status).toBe(413);
    expect(streamed.ms).toBeLessThan(5000);
    expect(growthMb).toBeLessThan(64);
    // Under the limit the body is read and the request goes on (here: to a 404 for the unknown function).
    const small = await k.api("POST", `/functions/${fnId}/invoke`, { token: invoker, body: { payload: "p".repeat(5 * MB) } });
    expect(small.status).toBe(404);
  });

  test("a function's own address (HTTP and RPC mode) refuses a request over 6 MiB with 413", async () => {
    await setup();
    const code = tgz({ "index.js": "exports.handler = async () => ({ statusCode: 200, body: 'ok' });" });
    const web = await deploy(k, project.id, { name: "web", runtime: "nodejs22.x", invocation_mode: "http", is_public: "true", http_auth_mode: "none" }, code);
    const rpc = await deploy(k, project.id, { name: "rpc", runtime: "nodejs22.x" }, code);
    expect([web.status, rpc.status]).toEqual([201, 201]);
    for (const [fn, headers] of [
      [web.body, {}],
      [rpc.body, { authorization: `Bearer ${sk}` }],
    ] as const) {
      // The host form of the address (invoke_url is the path form, /fn/<project>/<name>).
      const host = `${fn.name}.${project.id}.fn.localhost`;
      for (const declare of [true, false]) {
        const r = await post(k, "/upload", { headers: { ...headers, host }, prefix: '{"payload":"', chunk: Buffer.from("p".repeat(1 << 16)), total: 50_000_000, declare });
        expect(r.status, `${fn.name} declare=${declare}`).toBe(413);
        expect(r.body.error).toMatch(/KILN_MAX_INVOKE_BODY_BYTES/);
        expect(r.ms).toBeLessThan(5000);
      }
    }
  });

  test("JSON nested deeper than 128 levels is a 400 on every kind of route, checked before parsing", async () => {
    await setup();
    const deepArrays = "[".repeat(50_000) + "]".repeat(50_000);
    const deepObjects = '{"a":'.repeat(50_000) + "1" + "}".repeat(50_000);
    const cases: [string, string, string][] = [
      ["POST", "/projects", k.token],
      ["PATCH", `/projects/${project.id}`, k.token],
      ["POST", "/auth/signup", anon],
      ["POST", `/projects/${project.id}/variables`, k.token],
      ["POST", "/databases/notes/query/select", anon],
      ["POST", "/functions/doesnotmatter00000000/invoke", invoker],
      ["PATCH", `/auth/config?project_id=${project.id}`, k.token],
    ];
    for (const [method, path, token] of cases) {
      for (const body of [deepArrays, deepObjects, `{"name":"x","data":${deepArrays}}`]) {
        const r = await k.api(method, path, { token, body });
        expect(r.status, `${method} ${path}`).toBe(400);
        expect(r.body.error).toBe("request body is nested too deeply: JSON arrays and objects may nest at most 128 levels (KILN_MAX_JSON_DEPTH)");
      }
    }
    // The boundary: 128 levels are read (then the unknown function is the problem), 129 are not.
    const nest = (n: number) => `{"payload":${"[".repeat(n - 1)}${"]".repeat(n - 1)}}`;
    expect((await k.api("POST", "/functions/doesnotmatter00000000/invoke", { token: invoker, body: nest(128) })).status).toBe(404);
    expect((await k.api("POST", "/functions/doesnotmatter00000000/invoke", { token: invoker, body: nest(129) })).status).toBe(400);
    // Brackets inside strings, escaped quotes among them, are text, not nesting.
    const text = `${"[{".repeat(300)}\\"${"{[".repeat(300)}\\\\`;
    const signup = await k.api("POST", "/auth/signup", { token: anon, body: `{"email":"deep@example.com","password":"correct horse battery","data":{"note":"${text}"}}` });
    expect(signup.status, signup.text).toBe(201);
  });

  test("deep JSON in a deploy's text fields (openapi_spec, functions) is a 400, not a crash", async () => {
    await setup();
    const code = tgz({ "index.js": "exports.handler = async () => 1;" });
    const r = await deploy(k, project.id, { name: "deep", runtime: "nodejs22.x", openapi_spec: `{"openapi":"3.0.0","x":${"[".repeat(100_000)}${"]".repeat(100_000)}}` }, code);
    expect(r.status).toBe(400);
    expect(r.body.error).toMatch(/body field 'openapi_spec' is nested too deeply/);
    const form = new FormData();
    form.set("functions", "[".repeat(100_000) + "]".repeat(100_000));
    const batch = await fetch(`${k.url}/projects/${project.id}/functions/batch`, { method: "POST", headers: { authorization: `Bearer ${k.token}` }, body: form });
    expect(batch.status).toBe(400);
    expect(((await batch.json()) as { error: string }).error).toMatch(/body field 'functions' is nested too deeply/);
  });
});

describe("settings", () => {
  test("KILN_MAX_JSON_BODY_BYTES and the deploy upload limit (archive limit + 1 MiB) are enforced with 413; refused uploads do not hold up the stop", async () => {
    // KILN_STOP_TIMEOUT_MS: Kiln gives up on a stop after it and exits 1. A stop used to wait for the
    // connections still discarding the refused uploads, for their idle timeout (10 s).
    await withKiln({ env: { KILN_MAX_JSON_BODY_BYTES: "2000", KILN_SOURCE_ARCHIVE_LIMIT_MB: "1", KILN_STOP_TIMEOUT_MS: "6000" } }, async (kk) => {
      const p = await createProject(kk);
      const big = await kk.api("POST", "/projects", { body: { name: "x".repeat(2100) } });
      expect(big.status).toBe(413);
      expect(big.body.error).toBe("request body too large: JSON request bodies may be at most 2000 bytes (KILN_MAX_JSON_BODY_BYTES)");
      expect((await kk.api("POST", "/projects", { body: { name: "fits" } })).status).toBe(201);
      const blob = Buffer.alloc(3 * MB, 7);
      const one = await deploy(kk, p.id, { name: "big", runtime: "nodejs22.x" }, blob);
      expect(one.status).toBe(413);
      expect(one.body.error).toBe("request body too large: deploy uploads (the source archive limit plus 1 MiB for the other fields) may be at most 2 MiB (2097152 bytes, KILN_SOURCE_ARCHIVE_LIMIT_MB)");
      const form = new FormData();
      form.set("functions", JSON.stringify([{ name: "a", runtime: "nodejs22.x", file_field: "a" }]));
      form.set("a", new Blob([new Uint8Array(blob)]), "a.tgz");
      const batch = await fetch(`${kk.url}/projects/${p.id}/functions/batch`, { method: "POST", headers: { authorization: `Bearer ${kk.token}` }, body: form });
      expect(batch.status).toBe(413);
      expect(await kk.stop()).toBe(0);
    });
  });
});

describe("timestamps in query parameters", () => {
  const k = useKiln();

  test("stats with from=0000-01-01T00:00:00Z (or past 9999, or not a date) is a 400 naming the parameter", async () => {
    const p = await createProject(k);
    expect((await k.api("POST", `/projects/${p.id}/databases`, { body: { name: "when" } })).status).toBe(201);
    await eventually(() => k.api("GET", `/projects/${p.id}/databases/when`), (r) => r.body.status === "active", 30_000);
    const stats = (q: string) => k.api("GET", `/projects/${p.id}/databases/when/stats?${q}`);
    for (const [q, field] of [
      ["from=0000-01-01T00:00:00Z", "from"],
      ["to=0000-12-31T23:59:59Z", "to"],
      ["from=0001-01-01T00:00:00%2B01:00", "from"],
      ["to=9999-12-31T23:59:59-14:00", "to"],
      ["to=%2B275760-09-13T00:00:00Z", "to"],
      ["from=2024-02-30T00:00:00Z", "from"],
      ["from=yesterday", "from"],
    ]) {
      const r = await stats(q);
      expect(r.status, q).toBe(400);
      expect(r.body.error, q).toContain(`query field '${field}'`);
    }
    // The ends of the range are fine, and a default 'from' a day before an early 'to' stays in range.
    expect((await stats("from=0001-01-01T00:00:00Z&to=9999-12-31T23:59:59Z")).status).toBe(200);
    expect((await stats("to=0001-01-01T12:00:00Z")).status).toBe(200);
  });

  test("a cursor naming a time or id the store cannot hold is a 400", async () => {
    const cursor = (o: unknown) => Buffer.from(JSON.stringify(o)).toString("base64url");
    for (const c of [cursor({ v: 1, t: "0000-01-01T00:00:00Z", id: "x" }), cursor({ v: 1, t: "2024-01-01T00:00:00Z", id: "a\u0000" }), cursor({ v: 1, t: "Jan 1 2024", id: "x" })]) {
      const r = await k.api("GET", `/projects?cursor=${c}`);
      expect(r.status).toBe(400);
      expect(r.body.error).toMatch(/invalid cursor/);
    }
  });
});
