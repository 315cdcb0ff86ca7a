// Production profile: several Kiln instances share one PostgreSQL control store.
import { afterAll, describe, expect, test } from "vitest";
import { createProject, createToken, eventually, removeDir, startKiln, STORE, type TestKiln } from "../support/kiln";

describe.skipIf(STORE !== "postgres")("two Kiln instances on one PostgreSQL store", () => {
  const started: TestKiln[] = [];
  afterAll(async () => {
    for (const k of started) {
      await k.stop();
      removeDir(k.dataDir);
    }
  });

  test("see the same projects and tokens; a revocation on one is honoured by the other within seconds", async () => {
    const a = await startKiln();
    started.push(a);
    const b = await startKiln({ databaseUrl: a.databaseUrl, env: { KILN_PLATFORM_TOKEN: a.token } });
    started.push(b);
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
});
