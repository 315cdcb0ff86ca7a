// Helpers for the functions suites: archives from a file map, multipart deploys, waiting for a
// function's deployments to settle.
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterAll } from "vitest";
import { eventually, type TestKiln } from "./kiln";

const work = mkdtempSync(join(tmpdir(), "kiln-fn-test-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));
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
export async function settled(k: TestKiln, projectId: string, fnId: string) {
  return (
    await eventually(
      () => k.api("GET", `/projects/${projectId}/functions/${fnId}`),
      (r) => r.body.status !== "provisioning" && !r.body.pending_deployment_id,
      60_000,
    )
  ).body;
}
