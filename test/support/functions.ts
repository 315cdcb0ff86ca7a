// Helpers for the functions suites: archives from a file map, multipart deploys, waiting for a
// function's deployments to settle.
import { execFileSync } from "node:child_process";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterAll } from "vitest";
import { eventually, type TestKiln } from "./kiln";
import { removeDir } from "./dirs";

const work = mkdtempSync(join(tmpdir(), "kiln-fn-test-"));
afterAll(() => removeDir(work));
let n = 0;

/** A tar.gz of `files` (path → content); `extra` may add more to the folder first (symlinks, say). */
export function tgz(files: Record<string, string>, extra?: (dir: string) => void): Buffer {
  const dir = join(work, `src-${++n}`);
  mkdirSync(dir, { recursive: true });
  for (const [p, c] of Object.entries(files)) {
    mkdirSync(dirname(join(dir, p)), { recursive: true });
    writeFileSync(join(dir, p), c);
  }
  extra?.(dir);
  const out = join(work, `a-${n}.tgz`);
  execFileSync("tar", ["-czf", out, "-C", dir, "."]);
  return readFileSync(out);
}

/** POST /projects/{id}/functions as multipart: the fields, and the archive as `code`. */
export async function deploy(k: TestKiln, projectId: string, fields: Record<string, string>, code: Buffer | null, token?: string) {
  const form = new FormData();
  for (const [key, v] of Object.entries(fields)) form.set(key, v);
  if (code) form.set("code", new Blob([new Uint8Array(code)]), "code.tgz");
  const res = await fetch(`${k.url}/projects/${projectId}/functions`, { method: "POST", headers: { authorization: `Bearer ${token ?? k.token}` }, body: form });
  return { status: res.status, body: (await res.json()) as any };
}

/** The function once no deployment of it is provisioning or queued. */
export async function settled(k: TestKiln, projectId: string, fnId: string, timeoutMs = 60_000) {
  return (
    await eventually(
      () => k.api("GET", `/projects/${projectId}/functions/${fnId}`),
      (r) => r.body.status !== "provisioning" && !r.body.pending_deployment_id,
      timeoutMs,
    )
  ).body;
}

/** An npm package tarball (package/ at its root) whose index.js is `main`. */
export function npmTarball(name: string, main: string): Buffer {
  const dir = join(work, `pkg-${++n}`);
  mkdirSync(join(dir, "package"), { recursive: true });
  writeFileSync(join(dir, "package", "package.json"), JSON.stringify({ name, version: "1.0.0", main: "index.js" }));
  writeFileSync(join(dir, "package", "index.js"), main);
  execFileSync("tar", ["-czf", join(dir, "p.tgz"), "-C", dir, "package"]);
  return readFileSync(join(dir, "p.tgz"));
}

/**
 * A local file server on 127.0.0.1 (a package registry for builds, or a service a build must not
 * reach): `files` by path, every connection counted. While `hold()` is in force requests wait,
 * so a build stays busy exactly as long as a test needs, without a public registry or a timer.
 */
export async function localServer(files: Record<string, Buffer> = {}) {
  let connections = 0;
  let gate: Promise<void> | null = null;
  let open = () => {};
  const server = createServer(async (req, res) => {
    await gate;
    const body = files[req.url ?? ""];
    res.writeHead(body ? 200 : 404, { "content-type": "application/octet-stream" }).end(body ?? "");
  });
  server.on("connection", () => connections++);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as AddressInfo).port;
  return {
    close: () => {
      open();
      server.closeAllConnections();
      server.close();
    },
    port,
    url: `http://127.0.0.1:${port}`,
    connections: () => connections,
    hold: () => {
      gate ??= new Promise<void>((r) => (open = r));
    },
    release: () => {
      open();
      gate = null;
    },
  };
}

/** Pids of this machine's processes whose command line holds `tag` (what a test's function left running). */
export function processesTagged(tag: string): string[] {
  return readdirSync("/proc").filter((d) => {
    try {
      return /^\d+$/.test(d) && readFileSync(`/proc/${d}/cmdline`, "utf8").includes(tag);
    } catch {
      return false;
    }
  });
}
