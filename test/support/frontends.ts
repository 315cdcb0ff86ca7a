// Frontends through Kiln's API, for test files outside the frontends ones (the container runtime's).
import { execFileSync } from "node:child_process";
import { join } from "node:path";
import { eventually, type TestKiln } from "./kiln";

/**
 * The probe app: a stand-in `next` whose build writes a probe server as the standalone server.js,
 * so a Next.js server's sandbox is tested through the real deploy path without a real `next build`.
 */
export const PROBE_APP = join(import.meta.dirname, "../fixtures/frontends/standalone-probe");

export function appArchive(dir: string): Buffer {
  return execFileSync("tar", ["-czf", "-", "--exclude=node_modules", "--exclude=.next", "-C", dir, "."], { maxBuffer: 64 << 20 });
}

export async function deployFrontend(k: TestKiln, projectId: string, fields: Record<string, string | string[]>, archive: Buffer) {
  const form = new FormData();
  for (const [key, v] of Object.entries(fields)) for (const one of Array.isArray(v) ? v : [v]) form.append(key, one);
  form.set("archive", new Blob([new Uint8Array(archive)]), "app.tgz");
  const res = await fetch(`${k.url}/projects/${projectId}/frontends`, { method: "POST", headers: { authorization: `Bearer ${k.token}` }, body: form });
  return { status: res.status, body: (await res.json()) as any };
}

/** The frontend once no deployment of it is running or queued. */
export async function frontendSettled(k: TestKiln, projectId: string, id: string, timeoutMs: number) {
  return (await eventually(() => k.api("GET", `/projects/${projectId}/frontends/${id}`), (r) => r.status === 200 && r.body.status !== "provisioning" && !r.body.pending_deployment_id, timeoutMs)).body;
}

/** A request to a site: Kiln's port with the site's Host header (stock resolvers do not know *.localhost). */
export function siteFetch(siteUrl: string, path: string, init: RequestInit = {}) {
  const u = new URL(siteUrl);
  return fetch(`http://127.0.0.1:${u.port}${path}`, { ...init, headers: { ...(init.headers as Record<string, string>), host: u.host } });
}
