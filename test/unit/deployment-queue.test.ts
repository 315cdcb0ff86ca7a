// The deployment queue's state changes against a real embedded store, with a crash injected between
// steps: every change of a deployment and its function is one transaction, so what a crash leaves
// is always something the next start finishes (never a function `provisioning` or `deleting` with
// no work left to move it).
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { normalizeSource } from "../../server/functions/archive";
import { FunctionsService } from "../../server/functions/service";
import { SCHEMA } from "../../server/areas";
import { openControlStore } from "../../server/store/open-store";
import type { ControlStore, Sql } from "../../server/store/store";
import { tgz } from "../support/functions";

const dirs: string[] = [];
const stores: ControlStore[] = [];
afterAll(async () => {
  for (const s of stores) await s.close();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

async function setup() {
  const dir = mkdtempSync(join(tmpdir(), "kiln-queue-test-"));
  dirs.push(dir);
  const store = await openControlStore({ dataDir: dir, schema: SCHEMA });
  stores.push(store);
  const at = new Date().toISOString();
  await store.query(`insert into accounts (id, plan, created_at) values ('acct', 'free', $1)`, [at]);
  await store.query(`insert into projects (id, account_id, name, status, all_regions, created_at, updated_at) values ('proj', 'acct', 'p', 'active', true, $1, $1)`, [at]);
  return { dir, store };
}

/** The store, except that the first statement matching `at` throws: Kiln dying right there. */
function crashingAt(store: ControlStore, at: RegExp): ControlStore {
  let armed = true;
  const check = (text: string) => {
    if (armed && at.test(text)) {
      armed = false;
      throw new Error("crash");
    }
  };
  const wrap = (sql: Sql): Sql => ({
    query: (text, params) => {
      check(text);
      return sql.query(text, params);
    },
  });
  return {
    kind: store.kind,
    ...wrap(store),
    transaction: (fn) => store.transaction((tx) => fn(wrap(tx))),
    copyRows: (...a) => store.copyRows(...a),
    close: () => store.close(),
  };
}

/** A Kiln's functions over `store`; `failed` resolves when its queue gives up (the "crash"). */
function kiln(dir: string, store: ControlStore, maxFunctions = 100, shared: { instanceId: string; leaseMs: number; pollMs: number } | null = null) {
  let gaveUp = () => {};
  const failed = new Promise<void>((r) => (gaveUp = r));
  const functions = new FunctionsService({
    store,
    now: () => new Date(),
    blobDir: join(dir, "blobs", "functions"),
    codeDir: join(dir, "functions"),
    maxFunctions: () => maxFunctions,
    retireWorkers: async () => {},
    build: { hiddenPaths: [dir], sandbox: { want: "auto", allowUnsandboxed: true } },
    sandboxProblem: () => null,
    log: { error: () => gaveUp() },
    buildLogs: { line: () => {}, flush: async () => {}, summaries: async () => new Map() },
    shared,
  });
  return { functions, failed };
}

// `.service-dependencies` fails the build at once, before any runtime or installer is needed.
const failing = () => normalizeSource(tgz({ "index.js": "exports.handler = async () => 1", ".service-dependencies/x": "no" }), { runtime: "nodejs22.x", handler: "handler", limits: { uploadBytes: 1 << 20, normalizedBytes: 1 << 20, extractedBytes: 10 << 20 } });

async function settled(functions: FunctionsService, functionId: string) {
  for (let i = 0; i < 200; i++) {
    const deps = await functions.deployments(functionId);
    if (!deps.some((d) => d.status === "queued" || d.status === "building")) return deps;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error("the queue never settled");
}

describe("the deployment queue survives a crash between steps", () => {
  test("build failed + function failed are one change: a crash between them is finished by the next start", async () => {
    const { dir, store } = await setup();
    const first = kiln(dir, crashingAt(store, /update functions set status = 'failed'/));
    const { fn } = await first.functions.deploy("proj", { name: "f", runtime: "nodejs22.x" }, await failing());
    await first.failed;
    // Neither half was recorded: the deployment is still building, so the next start owns it.
    expect((await first.functions.deployments(fn.id))[0]!.status).toBe("building");
    const again = kiln(dir, store);
    await again.functions.resume();
    const deps = await settled(again.functions, fn.id);
    expect(deps[0]).toMatchObject({ status: "failed" });
    expect((await again.functions.byId(fn.id))!.status).toBe("failed");
  }, 60_000);

  test("a deletion cut short (deletion succeeded, function not yet deleted) runs again at the next start", async () => {
    const { dir, store } = await setup();
    const first = kiln(dir, crashingAt(store, /update functions set status = 'deleted'/));
    const { fn } = await first.functions.deploy("proj", { name: "f", runtime: "nodejs22.x" }, await failing());
    await settled(first.functions, fn.id);
    await first.functions.requestDelete(await first.functions.get("proj", fn.id));
    await first.failed;
    expect((await first.functions.byId(fn.id))!).toMatchObject({ status: "deleting", delete_requested: true });
    const again = kiln(dir, store);
    await again.functions.resume();
    const deps = await settled(again.functions, fn.id);
    expect(deps.map((d) => [d.kind, d.status])).toEqual([
      ["delete", "succeeded"],
      ["deploy", "failed"],
    ]);
    expect(await again.functions.byId(fn.id)).toBeNull();
    // The name is free again.
    expect((await again.functions.deploy("proj", { name: "f", runtime: "nodejs22.x" }, await failing())).created).toBe(true);
  }, 60_000);

  test("a refused deploy leaves no source archive behind; an accepted one is stored under its deployment", async () => {
    const { dir, store } = await setup();
    const { functions } = kiln(dir, store, 1);
    const blobs = () => readdirSync(join(dir, "blobs", "functions"));
    const { fn } = await functions.deploy("proj", { name: "one", runtime: "nodejs22.x" }, await failing());
    const [dep] = await settled(functions, fn.id);
    expect(blobs()).toEqual([`${dep!.id}.tar.gz`]);
    await expect(functions.deploy("proj", { name: "two", runtime: "nodejs22.x" }, await failing())).rejects.toMatchObject({ status: 403 });
    expect(blobs()).toEqual([`${dep!.id}.tar.gz`]);
  }, 60_000);
});

// Production profile: instances share the control store, each with its own data dir (here: one
// store, two data dirs).
describe("several instances (shared code)", () => {
  const ok = () => normalizeSource(tgz({ "index.js": "exports.handler = async () => 'shared'" }), { runtime: "nodejs22.x", handler: "handler", limits: { uploadBytes: 1 << 20, normalizedBytes: 1 << 20, extractedBytes: 10 << 20 } });
  const shared = (instanceId: string) => ({ instanceId, leaseMs: 60_000, pollMs: 100 });

  test("code one instance built is unpacked by another; an active deployment without stored code is stored at start by the instance that has its folder", async () => {
    const { dir, store } = await setup();
    const other = mkdtempSync(join(tmpdir(), "kiln-queue-test-"));
    dirs.push(other);
    const a = kiln(dir, store, 100, shared("a")).functions;
    const { fn } = await a.deploy("proj", { name: "f", runtime: "nodejs22.x" }, await ok());
    const [dep] = await settled(a, fn.id);
    expect(dep).toMatchObject({ status: "succeeded" });
    const b = kiln(other, store, 100, shared("b")).functions;
    const root = b.deploymentRoot(fn.id, dep!.id);
    expect(existsSync(root)).toBe(false);
    await b.codeReady(fn.id, dep!.id);
    expect(readFileSync(join(root, "index.js"), "utf8")).toBe(readFileSync(join(a.deploymentRoot(fn.id, dep!.id), "index.js"), "utf8"));
    expect(b.codeReady(fn.id, dep!.id)).toBeNull();

    // As an older Kiln left it: built, active, nothing in the store.
    await store.query(`delete from function_code where kind = 'built'`);
    const again = kiln(dir, store, 100, shared("a")).functions;
    await again.resume();
    for (let i = 0; i < 200 && !(await store.query(`select 1 from function_code where deployment_id = $1 and kind = 'built'`, [dep!.id])).length; i++) await new Promise((r) => setTimeout(r, 25));
    rmSync(root, { recursive: true, force: true });
    const third = mkdtempSync(join(tmpdir(), "kiln-queue-test-"));
    dirs.push(third);
    const c = kiln(third, store, 100, shared("c")).functions;
    await c.codeReady(fn.id, dep!.id);
    expect(existsSync(join(c.deploymentRoot(fn.id, dep!.id), "index.js"))).toBe(true);
    await again.drain();
  }, 60_000);
});
