import { execFile } from "node:child_process";
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { promisify } from "node:util";
import postgres from "postgres";
import { LineCounter, parseDocument, type Document } from "yaml";
import * as z from "zod";

const run = promisify(execFile);

/**
 * `kiln start --seed kiln.seed.yaml` (docs/testing.md, Seeds): projects with their configuration
 * manifest (the config area's format, `PUT /projects/{id}/config`) and data: SQL files per database,
 * end users with passwords, objects from a folder per bucket, functions and durable functions from
 * folders. Checked whole before Kiln opens anything (every problem names the file and line), then
 * applied through Kiln's own API, so the same rules and messages hold as for any client.
 */

const name = z.string().min(1);
const fromFolder = z.string().min(1).describe("a folder, relative to the seed file");
const projectSeed = z
  .object({
    name,
    config: z.union([z.string().min(1), z.record(z.string(), z.unknown())]).optional().describe("a manifest file (kiln.yaml) relative to the seed file, or the manifest inline"),
    databases: z.array(z.object({ name, sql: z.array(z.string().min(1)).default([]) }).strict()).default([]),
    users: z.array(z.object({ email: z.string().email(), password: z.string().min(1), data: z.record(z.string(), z.unknown()).optional() }).strict()).default([]),
    buckets: z.array(z.object({ name, public: z.boolean().optional(), objects: fromFolder.optional() }).strict()).default([]),
    functions: z.array(z.object({ name, runtime: z.string().min(1), from: fromFolder }).strict()).default([]),
    durable_functions: z.array(z.object({ name, runtime: z.string().min(1), from: fromFolder }).strict()).default([]),
  })
  .strict();
const seedSchema = z.object({ version: z.literal(1, { error: "version must be 1" }), projects: z.array(projectSeed).default([]) }).strict();

export type Seed = z.infer<typeof seedSchema> & { file: string; dir: string; lineOf(path: (string | number)[]): number };

export class SeedError extends Error {}

/** Reads and checks a seed file and every file it names; throws SeedError naming file, line and problem. */
export function loadSeed(file: string): Seed {
  const path = resolve(file);
  if (!existsSync(path)) throw new SeedError(`${file}: no such seed file`);
  const text = readFileSync(path, "utf8");
  const lines = new LineCounter();
  const doc: Document = parseDocument(text, { lineCounter: lines, prettyErrors: false });
  if (doc.errors.length) {
    const e = doc.errors[0]!;
    throw new SeedError(`${file}:${lines.linePos(e.pos[0]).line}: ${e.message.split("\n")[0]}`);
  }
  const lineOf = (p: (string | number)[]): number => {
    for (let n = p.length; n >= 0; n--) {
      const node = doc.getIn(p.slice(0, n), true) as { range?: [number, number, number] } | undefined;
      if (node?.range) return lines.linePos(node.range[0]).line;
    }
    return 1;
  };
  const parsed = seedSchema.safeParse(doc.toJS());
  if (!parsed.success) {
    const i = parsed.error.issues[0]!;
    const where = i.path.map(String).join(".");
    throw new SeedError(`${file}:${lineOf(i.path as (string | number)[])}: ${where ? `${where}: ` : ""}${i.message.replace(/^Invalid input: /, "")}`);
  }
  const dir = dirname(path);
  const seed: Seed = { ...parsed.data, file, dir, lineOf };
  // Every file and folder it names exists, before anything is made.
  const need = (rel: string, kind: "file" | "folder", at: (string | number)[]) => {
    const p = resolve(dir, rel);
    const ok = existsSync(p) && (kind === "file" ? statSync(p).isFile() : statSync(p).isDirectory());
    if (!ok) throw new SeedError(`${file}:${lineOf(at)}: ${at.join(".")}: no such ${kind} ${rel} (relative to ${dir})`);
  };
  const names = new Set<string>();
  seed.projects.forEach((p, i) => {
    if (names.has(p.name)) throw new SeedError(`${file}:${lineOf(["projects", i, "name"])}: projects.${i}.name: project '${p.name}' is listed twice`);
    names.add(p.name);
    if (typeof p.config === "string") need(p.config, "file", ["projects", i, "config"]);
    p.databases.forEach((d, j) => d.sql.forEach((s, k) => need(s, "file", ["projects", i, "databases", j, "sql", k])));
    p.buckets.forEach((b, j) => b.objects && need(b.objects, "folder", ["projects", i, "buckets", j, "objects"]));
    p.functions.forEach((f, j) => need(f.from, "folder", ["projects", i, "functions", j, "from"]));
    p.durable_functions.forEach((f, j) => need(f.from, "folder", ["projects", i, "durable_functions", j, "from"]));
  });
  return seed;
}

export type SeedCall = (method: string, path: string, body?: unknown, token?: string) => Promise<{ status: number; body: any }>;

/** Applies a checked seed through the API; the first failure throws SeedError naming the entry's line (or the SQL file's). */
export async function applySeed(seed: Seed, call: SeedCall, sleep: (ms: number) => Promise<void>): Promise<void> {
  const at = (path: (string | number)[]) => `${seed.file}:${seed.lineOf(path)}: ${path.join(".")}`;
  const must = async (where: (string | number)[], method: string, path: string, body?: unknown, token?: string, ok = [200, 201, 202]) => {
    const r = await call(method, path, body, token);
    if (!ok.includes(r.status)) throw new SeedError(`${at(where)}: ${method} ${path} answered ${r.status}: ${r.body?.error ?? JSON.stringify(r.body)}`);
    return r.body;
  };
  const until = async (where: (string | number)[], path: string, done: (b: any) => boolean, what: string) => {
    for (let i = 0; i < 1200; i++) {
      const b = await must(where, "GET", path);
      if (done(b)) return b;
      await sleep(100);
    }
    throw new SeedError(`${at(where)}: ${what} did not become ready in 120 s`);
  };

  for (const [i, p] of seed.projects.entries()) {
    const base = ["projects", i];
    const project = await must([...base, "name"], "POST", "/projects", { name: p.name });
    const pid = project.id as string;
    const serviceKey = (await must(base, "POST", `/projects/${pid}/service-keys`, { name: "seed" })).key as string;

    for (const [j, d] of p.databases.entries()) {
      const where = [...base, "databases", j];
      await must(where, "POST", `/projects/${pid}/databases`, { name: d.name });
      const db = await until(where, `/projects/${pid}/databases/${encodeURIComponent(d.name)}`, (b) => b.status !== "provisioning", `database ${d.name}`);
      if (db.status !== "active") throw new SeedError(`${at(where)}: database ${d.name} is ${db.status}`);
      const sql = postgres(db.connection_string, { max: 1, onnotice: () => {}, connect_timeout: 30 });
      try {
        for (const file of d.sql) {
          const text = readFileSync(resolve(seed.dir, file), "utf8");
          try {
            await sql.unsafe(text);
          } catch (e) {
            const err = e as { message?: string; position?: string };
            const line = err.position ? text.slice(0, Number(err.position) - 1).split("\n").length : null;
            throw new SeedError(`${file}${line ? `:${line}` : ""}: ${err.message ?? String(e)} (database ${d.name}, ${at([...where, "sql"])})`);
          }
        }
      } finally {
        await sql.end({ timeout: 1 });
      }
    }

    for (const [j, b] of p.buckets.entries()) {
      const where = [...base, "buckets", j];
      await must(where, "POST", `/projects/${pid}/storage/buckets`, { name: b.name, ...(b.public === undefined ? {} : { public: b.public }) });
      if (!b.objects) continue;
      const root = resolve(seed.dir, b.objects);
      for (const file of walk(root)) {
        const form = new FormData();
        const key = relative(root, file).split("/").map(encodeURIComponent).join("/");
        form.set("file", new Blob([readFileSync(file)]), file.split("/").pop());
        await must([...where, "objects"], "POST", `/storage/${encodeURIComponent(b.name)}/${key}`, form, serviceKey);
      }
    }

    for (const kind of ["functions", "durable_functions"] as const) {
      const collection = kind === "functions" ? "functions" : "durable-functions";
      for (const [j, f] of p[kind].entries()) {
        const where = [...base, kind, j];
        const { stdout } = await run("tar", ["-czf", "-", "-C", resolve(seed.dir, f.from), "."], { encoding: "buffer", maxBuffer: 256 << 20 });
        const form = new FormData();
        form.set("name", f.name);
        form.set("runtime", f.runtime);
        form.set("code", new Blob([new Uint8Array(stdout)]), "code.tgz");
        const made = await must(where, "POST", `/projects/${pid}/${collection}`, form);
        const fn = await until(where, `/projects/${pid}/${collection}/${made.id}`, (x) => x.status !== "provisioning" && !x.pending_deployment_id, `${collection} ${f.name}`);
        if (fn.status !== "active") throw new SeedError(`${at(where)}: ${f.name} did not deploy (${fn.status}); see kiln logs for its build`);
      }
    }

    // After functions, databases and buckets: a manifest configures them but never creates them.
    if (p.config !== undefined) {
      const where = [...base, "config"];
      const manifest = typeof p.config === "string" ? readFileSync(resolve(seed.dir, p.config), "utf8") : p.config;
      const r = await call("PUT", `/projects/${pid}/config`, manifest);
      if (r.status !== 200) {
        const problems = r.body?.errors?.map((e: { path: string; message: string }) => `${e.path}: ${e.message}`).join("; ");
        throw new SeedError(`${typeof p.config === "string" ? p.config : at(where)}: the manifest was refused (${r.status}): ${problems || r.body?.error}`);
      }
      const failed = (r.body?.results ?? []).filter((x: { action: string }) => x.action === "error");
      if (failed.length) throw new SeedError(`${typeof p.config === "string" ? p.config : at(where)}: ${failed.map((x: any) => `${x.section}${x.name ? ` ${x.name}` : ""}: ${x.notice}`).join("; ")}`);
    }

    for (const [j, u] of p.users.entries()) {
      await must([...base, "users", j], "POST", `/projects/${pid}/users`, { email: u.email, password: u.password, ...(u.data ? { data: u.data } : {}), email_confirmed: true });
    }
  }
}

function walk(dir: string): string[] {
  const out: string[] = [];
  for (const e of readdirSync(dir, { withFileTypes: true }).sort((a, b) => a.name.localeCompare(b.name))) {
    const p = join(dir, e.name);
    if (e.isDirectory()) out.push(...walk(p));
    else if (e.isFile()) out.push(p);
  }
  return out;
}
