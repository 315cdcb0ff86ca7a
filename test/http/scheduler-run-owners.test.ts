// Production profile: scheduler runs have an owner (the instance executing them) and a lease it
// renews. An instance's start fails only runs that cannot still be in progress, never the run another
// live instance is executing; a run whose instance died is failed once its lease lapses.
import { describe, expect, test } from "vitest";
import { deploy, settled, tgz } from "../support/functions";
import { createProject, eventually, removeDir, startKiln, STORE, type TestKiln } from "../support/kiln";

// Each tick's run lasts as long as its payload asks.
const CODE = { "index.js": `exports.handler = async (e) => { await new Promise((r) => setTimeout(r, e.sleep_ms)); return "ok"; };` };
const LEASE_MS = 3000;
const INTERRUPTED = "interrupted: Kiln stopped during the run";

const runsOf = async (kk: TestKiln, base: string, id: string) => (await kk.api("GET", `${base}/${id}/runs?limit=100`)).body.data as any[];
/** Moves Kiln's clock; with the controllable clock the answer comes once the runs it caused have finished. */
const advance = (kk: TestKiln, seconds: number) => kk.api("POST", "/_kiln/clock/advance", { token: null, body: { seconds } });

describe.skipIf(STORE !== "postgres")("scheduler runs across Kiln instances", () => {
  test("another instance's start leaves a running run alone; the run of an instance that died is failed once its lease lapses", { timeout: 180_000 }, async () => {
    const env = { KILN_SCHEDULER_LEASE_MS: String(LEASE_MS) };
    const a = await startKiln({ args: ["--controllable-clock"], env });
    let b: TestKiln | null = null;
    try {
      const p = await createProject(a);
      const fn = await settled(a, p.id, (await deploy(a, p.id, { name: "slow", runtime: "nodejs22.x" }, tgz(CODE))).body.id);
      expect(fn.status).toBe("active");
      const base = `/projects/${p.id}/functions/${fn.id}/schedulers`;
      // 20 s into a minute, so the advance crosses exactly one minute boundary.
      const now = Date.parse((await a.api("GET", "/_kiln/clock", { token: null })).body.now);
      const aligned = Math.floor(now / 60_000) * 60_000 + 80_000;
      expect((await a.api("POST", "/_kiln/clock/set", { token: null, body: { now: new Date(aligned).toISOString() } })).status).toBe(200);
      const s = (await a.api("POST", base, { body: { name: "slow", schedule: { kind: "cron", cron_expression: "* * * * *" }, payload: { sleep_ms: 12_000 } } })).body;

      const ticking = advance(a, 60);
      const [run] = await eventually(() => runsOf(a, base, s.id), (r) => r.length === 1 && r[0].status === "running", 30_000);
      b = await startKiln({ databaseUrl: a.databaseUrl, args: ["--controllable-clock"], env: { ...env, KILN_PLATFORM_TOKEN: a.token } });
      // b's start has run, and its sweeps for longer than a lease: a renews its run's lease meanwhile.
      expect((await runsOf(b, base, s.id))[0]).toMatchObject({ id: run.id, status: "running" });
      await new Promise((r) => setTimeout(r, LEASE_MS + 1500));
      expect((await runsOf(b, base, s.id))[0]).toMatchObject({ id: run.id, status: "running" });
      expect((await ticking).status).toBe(200);
      expect((await runsOf(a, base, s.id))[0]).toMatchObject({ id: run.id, status: "succeeded", error: null });

      // a dies during the next run: nothing renews its lease, and b fails the run once it lapses.
      void advance(a, 60).catch(() => {});
      const runs = await eventually(() => runsOf(a, base, s.id), (r) => r.length === 2 && r[0].status === "running", 30_000);
      a.proc.kill("SIGKILL");
      await new Promise((r) => a.proc.once("exit", r));
      const after = await eventually(() => runsOf(b!, base, s.id), (r) => r[0].status !== "running", 4 * LEASE_MS);
      expect(after[0]).toMatchObject({ id: runs[0].id, status: "failed", error: INTERRUPTED });
      expect(after[1]).toMatchObject({ id: run.id, status: "succeeded" });
    } finally {
      await a.stop();
      removeDir(a.dataDir);
      if (b) {
        await b.stop();
        removeDir(b.dataDir);
      }
    }
  });
});
