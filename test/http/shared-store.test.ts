// Production profile: several Kiln instances share one PostgreSQL control store.
import { afterAll, describe, expect, test } from "vitest";
import { tgz } from "../support/functions";
import { createProject, createToken, eventually, removeDir, startKiln, STORE, type TestKiln } from "../support/kiln";

describe.skipIf(STORE !== "postgres")("two Kiln instances on one PostgreSQL store", () => {
  const started: TestKiln[] = [];
  afterAll(async () => {
    for (const k of started) {
      await k.stop();
      removeDir(k.dataDir);
    }
  });

  // One pair for the file (a Kiln start is ~2 CPU-s).
  let pair: Promise<[TestKiln, TestKiln]> | null = null;
  const instances = () =>
    (pair ??= (async () => {
      const a = await startKiln();
      started.push(a);
      const b = await startKiln({ databaseUrl: a.databaseUrl, env: { KILN_PLATFORM_TOKEN: a.token } });
      started.push(b);
      return [a, b] as [TestKiln, TestKiln];
    })());

  test("see the same projects and tokens; a revocation on one is honoured by the other within seconds", async () => {
    const [a, b] = await instances();
    const p = await createProject(a, "shared");
    expect((await b.api("GET", `/projects/${p.id}`)).body.name).toBe("shared");
    const t = await createToken(a, p.id);
    expect((await b.api("GET", `/projects/${p.id}`, { token: t.token })).status).toBe(200);
    expect((await a.api("DELETE", `/projects/${p.id}/access-tokens/${t.id}`)).status).toBe(204);
    // Immediately on the instance that revoked it; within the credential cache TTL on the other.
    expect((await a.api("GET", `/projects/${p.id}`, { token: t.token })).status).toBe(401);
    await eventually(() => b.api("GET", `/projects/${p.id}`, { token: t.token }), (r) => r.status === 401, 5000);
    // Usage recorded on both instances adds up.
    const t2 = await createToken(a, p.id);
    for (const k of [a, b, a]) await k.api("GET", `/projects/${p.id}`, { token: t2.token });
    await eventually(() => a.api("GET", `/projects/${p.id}/access-tokens/${t2.id}`), (r) => r.body.all_time_requests === 3, 5000);
  });

  test("frontends: a site deployed, redeployed or deleted through one instance is served (or not) by the other without a restart; either redeploys the other's upload", async () => {
    const [a, b] = await instances();
    const p = await createProject(a, "sites");
    const deploy = async (k: TestKiln, version: string) => {
      const form = new FormData();
      form.append("name", "www");
      form.set("archive", new Blob([new Uint8Array(tgz({ "index.html": `<h1>version ${version}</h1>` }))]), "site.tgz");
      const res = await fetch(`${k.url}/projects/${p.id}/frontends`, { method: "POST", headers: { authorization: `Bearer ${k.token}` }, body: form });
      expect(res.status).toBeLessThan(300);
      return ((await res.json()) as { id: string }).id;
    };
    const settled = (k: TestKiln, id: string) =>
      eventually(() => k.api("GET", `/projects/${p.id}/frontends/${id}`), (r) => r.status === 200 && r.body.status === "active" && !r.body.pending_deployment_id, 60_000);
    // The site's host name on either instance's port.
    const page = async (k: TestKiln, host: string) => {
      const res = await fetch(`${k.url}/`, { headers: { host: `${host}:${new URL(k.url).port}` } });
      return `${res.status} ${await res.text()}`;
    };
    const id = await deploy(a, "one");
    const host = new URL((await settled(a, id)).body.site_url).hostname;
    expect(await page(a, host)).toBe("200 <h1>version one</h1>");
    await eventually(() => page(b, host), (t) => t === "200 <h1>version one</h1>", 15_000);

    // A deploy through B: both serve it.
    await deploy(b, "two");
    await settled(b, id);
    expect(await page(b, host)).toBe("200 <h1>version two</h1>");
    await eventually(() => page(a, host), (t) => t === "200 <h1>version two</h1>", 15_000);
    // A redeploys B's upload (the archive from the control store): version two again, as a new deployment.
    const re = await a.api("POST", `/projects/${p.id}/frontends/${id}/redeploy`);
    expect(re.status).toBe(200);
    const after = await settled(a, id);
    expect(after.body.current_deployment_id).toBe(re.body.current_deployment_id ?? re.body.pending_deployment_id);
    expect((await a.api("GET", `/projects/${p.id}/frontends/${id}/deployments`)).body.data[0]).toMatchObject({ kind: "redeploy", status: "succeeded" });
    await eventually(() => page(b, host), (t) => t === "200 <h1>version two</h1>", 15_000);

    // Deleted through A: B stops serving it.
    expect((await a.api("DELETE", `/projects/${p.id}/frontends/${id}`)).status).toBe(202);
    await eventually(() => a.api("GET", `/projects/${p.id}/frontends/${id}`), (r) => r.status === 404, 30_000);
    await eventually(() => page(b, host), (t) => t.startsWith("404"), 15_000);
  }, 120_000);
});
