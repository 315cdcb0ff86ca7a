// Kiln as a test fixture (issue 31): reset, snapshot and restore times, and a file of 50 resetting
// tests against starting a Kiln per test. Run: npm run bench:testing
// Targets: reset p50 < 50 ms (1 database of 100 rows) and < 250 ms (5 databases of 10k rows each);
// 50 resetting tests in < 5 s.
//
// A reset is a restore of the reset point (the snapshot `seed` or `start`): the same code path as
// `POST /_kiln/snapshots/{name}/restore`. So each case builds its state, keeps it as a snapshot,
// changes something, and restores it ROUNDS times (default 10); reset p50/p99 are those restores.
// Snapshot times are ROUNDS saves of the same state. The "Kiln per test" side starts and stops
// KILNS_PER_TEST Kilns (default 5; 50 would take minutes on this 2-core machine) and scales the
// measured time per test to 50, printed as such.
import postgres from "postgres";
import { startKiln, type RunningKiln } from "../testing/index.mjs";
import { pct } from "./support";

const ROUNDS = Number(process.env.ROUNDS ?? 10);
const KILNS_PER_TEST = Number(process.env.KILNS_PER_TEST ?? 5);

async function api(k: RunningKiln, method: string, path: string, body?: unknown) {
  const res = await fetch(k.url + path, { method, headers: { authorization: `Bearer ${k.platformToken}`, "content-type": "application/json" }, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await res.text();
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text}`);
  return text ? JSON.parse(text) : undefined;
}

async function activeDatabase(k: RunningKiln, projectId: string, name: string): Promise<string> {
  await api(k, "POST", `/projects/${projectId}/databases`, { name });
  for (;;) {
    const d = await api(k, "GET", `/projects/${projectId}/databases/${name}`);
    if (d.status === "active") return d.connection_string;
    if (d.status !== "provisioning") throw new Error(`database ${name}: ${d.status}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function fill(url: string, rows: number): Promise<void> {
  const c = postgres(url, { max: 1, onnotice: () => {} });
  await c`create table items (id int primary key, name text not null)`;
  await c`insert into items select g, 'item ' || g from generate_series(1, ${rows}) g`;
  await c.end({ timeout: 1 });
}

const ms = (xs: number[]) => `p50 ${pct(xs, 50).toFixed(0)} ms, p99 ${pct(xs, 99).toFixed(0)} ms (n=${xs.length})`;

async function timed(fn: () => Promise<unknown>): Promise<number> {
  const t0 = performance.now();
  await fn();
  return performance.now() - t0;
}

/** Builds a case's state in a fresh Kiln, then measures snapshot and restore of it. */
async function measureCase(name: string, build: (k: RunningKiln, projectId: string) => Promise<void>) {
  const k = await startKiln({ clock: "controllable" });
  try {
    const p = await api(k, "POST", "/projects", { name: "bench" });
    await build(k, p.id);
    const saves: number[] = [];
    for (let i = 0; i < ROUNDS; i++) {
      saves.push(await timed(() => k.snapshot(`s${i}`)));
      if (i) await api(k, "DELETE", `/_kiln/snapshots/s${i}`);
    }
    const restores: number[] = [];
    for (let i = 0; i < ROUNDS; i++) {
      await api(k, "POST", "/projects", { name: `later-${i}` });
      restores.push(await timed(() => k.restore("s0")));
    }
    const size = (await api(k, "GET", "/_kiln/snapshots")).data.find((s: { name: string }) => s.name === "s0").size_bytes;
    console.log(`${name}: snapshot ${ms(saves)}; reset/restore ${ms(restores)}; snapshot size ${(size / 1048576).toFixed(1)} MiB`);
    return { saves, restores };
  } finally {
    await k.stop();
  }
}

const small = await measureCase("1 database of 100 rows", async (k, id) => fill(await activeDatabase(k, id, "app"), 100));
const large = await measureCase("5 databases of 10k rows each", async (k, id) => {
  for (let i = 0; i < 5; i++) await fill(await activeDatabase(k, id, `db${i}`), 10_000);
});
await measureCase("100 objects", async (k, id) => {
  await api(k, "POST", `/projects/${id}/storage/buckets`, { name: "files" });
  const sk = await k.serviceKey(id);
  for (let i = 0; i < 100; i++) {
    const form = new FormData();
    form.set("file", new Blob([`object ${i} `.repeat(100)], { type: "text/plain" }), `o${i}.txt`);
    const res = await fetch(`${k.url}/storage/files/o${i}.txt`, { method: "POST", headers: { authorization: `Bearer ${sk}` }, body: form });
    if (!res.ok) throw new Error(`upload: ${res.status} ${await res.text()}`);
  }
});

// A test file of 50 tests, each resetting first and then making a project, against a Kiln per test.
const k = await startKiln({ clock: "controllable" });
let fileMs: number;
try {
  fileMs = await timed(async () => {
    for (let i = 0; i < 50; i++) {
      await k.reset();
      await api(k, "POST", "/projects", { name: `t${i}` });
    }
  });
} finally {
  await k.stop();
}
const perTest = await timed(async () => {
  for (let i = 0; i < KILNS_PER_TEST; i++) {
    const kk = await startKiln({ clock: "controllable" });
    await api(kk, "POST", "/projects", { name: `t${i}` });
    await kk.stop();
  }
});
const perTestFor50 = (perTest / KILNS_PER_TEST) * 50;
console.log(`50 tests with reset(): ${(fileMs / 1000).toFixed(1)} s; a Kiln per test: ${(perTest / 1000).toFixed(1)} s for ${KILNS_PER_TEST}, ${(perTestFor50 / 1000).toFixed(1)} s scaled to 50 (${(perTestFor50 / fileMs).toFixed(1)}x)`);
console.log(
  `targets: small reset p50 ${pct(small.restores, 50).toFixed(0)} ms (< 50: ${pct(small.restores, 50) < 50 ? "met" : "NOT met"}), large reset p50 ${pct(large.restores, 50).toFixed(0)} ms (< 250: ${pct(large.restores, 50) < 250 ? "met" : "NOT met"}), 50 resetting tests ${(fileMs / 1000).toFixed(1)} s (< 5 s: ${fileMs < 5000 ? "met" : "NOT met"})`,
);
