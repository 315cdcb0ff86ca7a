// `kiln storage`: buckets, cp up and down (multipart and resumable, resumed after an interruption),
// ls, mv, rm, policies, and its errors, against a real Kiln.
import { createHash, randomBytes } from "node:crypto";
import { mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { createProject, removeDir, useCli, useKiln } from "../support/kiln";

const k = useKiln();
const { run, json, configDir } = useCli(k, { passToken: true });
const dir = mkdtempSync(join(tmpdir(), "kiln-storage-cli-"));
afterAll(() => removeDir(dir));

const MB = 1024 * 1024;
const md5 = (b: Uint8Array) => createHash("md5").update(b).digest("hex");

async function setup() {
  const p = await createProject(k);
  const sk = (await k.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "cli" } })).body.key as string;
  const bucket = `b-${randomBytes(3).toString("hex")}`;
  json("storage", "buckets", "create", bucket, "--project", p.id);
  return { p, sk, bucket, key: ["--service-key", sk] };
}

function file(name: string, bytes: Uint8Array): string {
  const path = join(dir, name);
  writeFileSync(path, bytes);
  return path;
}

/** The CLI's saved resumable-upload states (one per interrupted cp). */
const states = () => {
  try {
    return readdirSync(join(configDir, "uploads")).filter((f) => f.endsWith(".json")).map((f) => JSON.parse(readFileSync(join(configDir, "uploads", f), "utf8")));
  } catch {
    return [];
  }
};

describe("kiln storage buckets", () => {
  test("create, list, get, update, delete", async () => {
    const p = await createProject(k);
    const created = json("storage", "buckets", "create", "avatars", "--project", p.id, "--file-size-limit", "1MB", "--allowed-mime-types", "image/*,text/plain");
    expect(created).toMatchObject({ name: "avatars", project_id: p.id, file_size_limit: 1_000_000, allowed_mime_types: ["image/*", "text/plain"] });
    expect(json("storage", "buckets", "list", "--project", p.id).buckets.map((b: any) => b.name)).toEqual(["avatars"]);
    expect(json("storage", "buckets", "get", "avatars", "--project", p.id).id).toBe(created.id);
    const updated = json("storage", "buckets", "update", "avatars", "--project", p.id, "--file-size-limit", "none", "--allowed-mime-types", "");
    expect(updated).toMatchObject({ file_size_limit: null, allowed_mime_types: [] });
    expect(json("storage", "buckets", "update", "avatars", "--project", p.id, "--file-size-limit", "2048").file_size_limit).toBe(2048);
    const table = run("storage", "buckets", "list", "--project", p.id);
    expect(table.out).toMatch(/^NAME\s+ID/);
    expect(table.out).toContain("avatars");
    const dup = run("storage", "buckets", "create", "avatars", "--project", p.id);
    expect(dup.code).not.toBe(0);
    expect(dup.err).toMatch(/409/);
    expect(run("storage", "buckets", "update", "avatars", "--project", p.id).err).toMatch(/nothing to change/);
    expect(json("storage", "buckets", "delete", "avatars", "--project", p.id).message).toMatch(/deleted/);
    expect(json("storage", "buckets", "list", "--project", p.id).buckets).toEqual([]);
    expect(run("storage", "buckets", "list").err).toMatch(/--project/);
  });
});

describe("kiln storage cp", () => {
  test("upload and download round trip (multipart), --upsert, into a folder and to stdout", async () => {
    const { sk, bucket, key } = await setup();
    const bytes = randomBytes(300_000);
    const local = file("round.bin", bytes);
    const up = json("storage", "cp", local, `${bucket}/dir/round.bin`, ...key, "--metadata", '{"team":"a"}');
    expect(up).toMatchObject({ direction: "upload", bytes: 300_000, object: { name: "dir/round.bin", size: 300_000, etag: md5(bytes), metadata: { team: "a" } } });
    expect(up.session).toBeUndefined();
    // A folder destination keeps the file name; the source's type comes from its extension.
    const text = file("note.txt", new TextEncoder().encode("hello"));
    expect(json("storage", "cp", text, `${bucket}/docs/`, ...key).object).toMatchObject({ name: "docs/note.txt", mime_type: "text/plain" });

    const back = join(dir, "round.back");
    const down = json("storage", "cp", `${bucket}/dir/round.bin`, back, ...key);
    expect(down).toMatchObject({ direction: "download", bytes: 300_000, etag: `"${md5(bytes)}"` });
    expect(md5(readFileSync(back))).toBe(md5(bytes));
    const human = run("storage", "cp", `kiln://${bucket}/docs/note.txt`, dir + "/", ...key);
    expect(human.code).toBe(0);
    expect(human.out).toMatch(/^Downloaded .*note\.txt/);
    expect(readFileSync(join(dir, "note.txt"), "utf8")).toBe("hello");
    const stdout = run("storage", "cp", `${bucket}/docs/note.txt`, "-", ...key);
    expect(stdout.out).toBe("hello");

    // An existing object is 409 unless --upsert.
    const again = run("storage", "cp", local, `${bucket}/dir/round.bin`, ...key);
    expect(again.code).not.toBe(0);
    expect(again.err).toMatch(/409.*already exists/);
    const other = randomBytes(1000);
    expect(json("storage", "cp", file("other.bin", other), `${bucket}/dir/round.bin`, ...key, "--upsert").object.etag).toBe(md5(other));
    expect((await k.api("GET", `/storage/${bucket}/dir/round.bin`, { token: sk })).text.length).toBeGreaterThan(0);
    const missing = run("storage", "cp", `${bucket}/nope.bin`, join(dir, "nope"), ...key);
    expect(missing.code).not.toBe(0);
    expect(missing.err).toMatch(/404 object not found/);
    expect(readdirSync(dir).filter((f) => f.includes("kiln-download"))).toEqual([]);
  });

  test("resumable: a 12 MiB file in 5 MiB parts", async () => {
    const { bucket, key } = await setup();
    const bytes = randomBytes(12 * MB + 4321);
    const local = file("resumable.bin", bytes);
    const up = json("storage", "cp", local, `${bucket}/big/resumable.bin`, ...key, "--resumable", "--part-size", "5242880");
    expect(up.session).toMatchObject({ part_size: 5 * MB, total_parts: 3, parts_sent: 3, parts_already_uploaded: 0, resumed: false });
    expect(up.object).toMatchObject({ name: "big/resumable.bin", size: bytes.length, etag: expect.stringMatching(/-3$/) });
    const back = join(dir, "resumable.back");
    json("storage", "cp", `${bucket}/big/resumable.bin`, back, ...key);
    expect(md5(readFileSync(back))).toBe(md5(bytes));
    expect(states()).toEqual([]);
  });

  test("an interrupted resumable upload resumes: only the missing parts are sent, into the same session", async () => {
    const { sk, bucket, key } = await setup();
    const bytes = randomBytes(12 * MB + 10);
    const local = file("interrupted.bin", bytes);
    const args = ["storage", "cp", local, `${bucket}/interrupted.bin`, ...key, "--resumable", "--part-size", "5MiB"];
    const stopped = run(...args, "--stop-after-parts", "1");
    expect(stopped.code).not.toBe(0);
    expect(stopped.err).toMatch(/stopped after 1 part.*1 of 3 parts.*run the same command again to resume/);
    const [state] = states().filter((s) => s.bucket === bucket);
    expect(state).toMatchObject({ bucket, path: "interrupted.bin", size: bytes.length, part_size: 5 * MB, total_parts: 3 });
    // The server has exactly one part and no object yet.
    const status = await k.api("GET", `/storage/${bucket}/interrupted.bin`, { token: sk, headers: { "x-upload-session": state.session_id } });
    expect(status.body).toMatchObject({ parts_uploaded: 1, bytes_uploaded: 5 * MB });
    expect((await k.api("GET", `/storage/${bucket}`, { token: sk })).body.objects).toEqual([]);

    const resumed = json(...args);
    expect(resumed.session).toEqual({ id: state.session_id, part_size: 5 * MB, total_parts: 3, parts_sent: 2, parts_already_uploaded: 1, resumed: true });
    expect(resumed.bytes_sent).toBe(bytes.length - 5 * MB);
    const back = join(dir, "interrupted.back");
    json("storage", "cp", `${bucket}/interrupted.bin`, back, ...key);
    expect(md5(readFileSync(back))).toBe(md5(bytes));
    expect(states().filter((s) => s.bucket === bucket)).toEqual([]);
    expect((await k.api("GET", `/storage/${bucket}/interrupted.bin`, { token: sk, headers: { "x-upload-session": state.session_id } })).status).toBe(404);
  });

  test("a resumable upload whose session is gone, or whose file changed, starts over", async () => {
    const { sk, bucket, key } = await setup();
    const bytes = randomBytes(11 * MB);
    const local = file("gone.bin", bytes);
    const args = ["storage", "cp", local, `${bucket}/gone.bin`, ...key, "--resumable", "--part-size", "5242880"];
    expect(run(...args, "--stop-after-parts", "2").code).not.toBe(0);
    const [state] = states().filter((s) => s.bucket === bucket);
    expect((await k.api("DELETE", `/storage/${bucket}/gone.bin`, { token: sk, headers: { "x-upload-session": state.session_id } })).status).toBe(200);
    const again = run("--json", ...args);
    expect(again.code).toBe(0);
    expect(again.err).toMatch(/is gone.*starting over/);
    const out = JSON.parse(again.out);
    expect(out.session).toMatchObject({ parts_sent: 3, parts_already_uploaded: 0, resumed: false });
    expect(out.session.id).not.toBe(state.session_id);
    expect(out.object.size).toBe(bytes.length);

    // The file changes between the runs: the old session is abandoned, the new bytes uploaded whole.
    const args2 = ["storage", "cp", local, `${bucket}/changed.bin`, ...key, "--resumable", "--part-size", "5242880"];
    expect(run(...args2, "--stop-after-parts", "1").code).not.toBe(0);
    const [first] = states().filter((s) => s.bucket === bucket);
    const changed = randomBytes(11 * MB + 1);
    writeFileSync(local, changed);
    const third = run("--json", ...args2);
    expect(third.err).toMatch(/changed since the interrupted upload; starting over/);
    expect(JSON.parse(third.out).session).toMatchObject({ parts_already_uploaded: 0, parts_sent: 3 });
    expect((await k.api("GET", `/storage/${bucket}/changed.bin`, { token: sk, headers: { "x-upload-session": first.session_id } })).status).toBe(404);
    const back = join(dir, "changed.back");
    json("storage", "cp", `${bucket}/changed.bin`, back, ...key);
    expect(md5(readFileSync(back))).toBe(md5(changed));
  });
});

describe("kiln storage ls, mv, rm, policies", () => {
  test("ls with a prefix follows next_cursor (--limit caps), mv renames, rm deletes", async () => {
    const { bucket, key } = await setup();
    const local = file("small.txt", new TextEncoder().encode("x"));
    for (const name of ["a/1.txt", "a/2.txt", "a/3.txt", "a/4.txt", "b/1.txt"]) json("storage", "cp", local, `${bucket}/${name}`, ...key);
    const all = json("storage", "ls", `${bucket}/a/`, ...key, "--page-size", "2");
    expect(all.objects.map((o: any) => o.name)).toEqual(["a/1.txt", "a/2.txt", "a/3.txt", "a/4.txt"]);
    expect(all.next_cursor).toBeNull();
    const capped = json("storage", "ls", `${bucket}/a/`, ...key, "--page-size", "2", "--limit", "3");
    expect(capped.objects.map((o: any) => o.name)).toEqual(["a/1.txt", "a/2.txt", "a/3.txt"]);
    expect(capped.next_cursor).toEqual(expect.any(String));
    expect(json("storage", "ls", bucket, ...key).objects).toHaveLength(5);
    const table = run("storage", "ls", `${bucket}/b`, ...key);
    expect(table.out).toMatch(/^NAME\s+SIZE\s+MIME_TYPE/);
    expect(table.out).toContain("b/1.txt");

    expect(json("storage", "mv", `${bucket}/a/1.txt`, "c/moved.txt", ...key)).toMatchObject({ name: "c/moved.txt" });
    expect(json("storage", "ls", `${bucket}/c/`, ...key).objects.map((o: any) => o.name)).toEqual(["c/moved.txt"]);
    expect(run("storage", "mv", `${bucket}/a/1.txt`, "c/x.txt", ...key).err).toMatch(/404/);
    expect(json("storage", "rm", `${bucket}/c/moved.txt`, `${bucket}/b/1.txt`, ...key)).toEqual({ deleted: [`${bucket}/c/moved.txt`, `${bucket}/b/1.txt`] });
    expect(json("storage", "ls", bucket, ...key).objects.map((o: any) => o.name)).toEqual(["a/2.txt", "a/3.txt", "a/4.txt"]);
    const gone = run("storage", "rm", `${bucket}/c/moved.txt`, ...key);
    expect(gone.code).not.toBe(0);
    expect(gone.err).toMatch(/c\/moved\.txt: 404 object not found/);
    expect(run("storage", "rm", bucket, ...key).err).toMatch(/names a bucket but no object/);
  });

  test("policies create, list, delete: the bucket by name (with --project) or by id", async () => {
    const { p, bucket, key } = await setup();
    const id = json("storage", "buckets", "get", bucket, "--project", p.id).id;
    const created = json("storage", "policies", "create", bucket, "--project", p.id, ...key, "--name", "own files", "--operation", "select", "--definition", "owner_id = auth.uid()");
    expect(created).toMatchObject({ bucket_id: id, name: "own files", operation: "SELECT", definition: "owner_id = auth.uid()" });
    expect(json("storage", "policies", "list", id, ...key).policies.map((x: any) => x.id)).toEqual([created.id]);
    expect(json("storage", "policies", "list", bucket, "--project", p.id, ...key).policies.map((x: any) => x.name)).toEqual(["own files"]);
    const bad = run("storage", "policies", "create", bucket, "--project", p.id, ...key, "--name", "bad", "--operation", "SELECT", "--definition", "ownr_id = auth.uid()");
    expect(bad.code).not.toBe(0);
    expect(bad.err).toMatch(/400 .*unknown column 'ownr_id'/);
    // A name without --project is taken as an id: not found, with the hint.
    expect(run("storage", "policies", "list", bucket, ...key).err).toMatch(/^kiln: 404 .*\nhint: .*pass --project/);
    expect(json("storage", "policies", "delete", bucket, created.id, "--project", p.id, ...key).message).toEqual(expect.any(String));
    expect(json("storage", "policies", "list", id, ...key).policies).toEqual([]);
  });

  test("errors: no service key, a platform token where a key is needed, bad arguments", async () => {
    const { p, bucket, key } = await setup();
    const local = file("err.txt", new TextEncoder().encode("x"));
    for (const args of [
      ["storage", "cp", local, `${bucket}/x.txt`],
      ["storage", "cp", `${bucket}/x.txt`, join(dir, "x")],
      ["storage", "ls", bucket],
      ["storage", "rm", `${bucket}/x.txt`],
      ["storage", "mv", `${bucket}/x.txt`, "y.txt"],
    ]) {
      const r = run(...args);
      expect([args.join(" "), r.code]).toEqual([args.join(" "), 1]);
      expect(r.err).toMatch(/^kiln: storage objects needs --key <key>\nhint: pass a service key \(sk-\.\.\.\) of the project with --key, or set KILN_SERVICE_KEY/);
    }
    expect(run("storage", "policies", "list", bucket, "--project", p.id).err).toMatch(/^kiln: storage policies needs --key <key>/);
    // The platform token as the key: the API's refusal comes through.
    const refused = run("storage", "ls", bucket, "--service-key", k.token);
    expect(refused.code).not.toBe(0);
    expect(refused.err).toMatch(/403/);
    expect(run("storage", "cp", local, `${bucket}/x.txt`, ...key, "--part-size", "lots", "--resumable").err).toMatch(/--part-size must be a size/);
    expect(run("storage", "cp", local, bucket, ...key, "--metadata", "[1]").err).toMatch(/--metadata must be a JSON object/);
    expect(run("storage", "cp", dir, `${bucket}/d`, ...key).err).toMatch(/is a directory/);
    expect(run("storage", "ls", `${bucket}`, ...key, "--limit", "0").err).toMatch(/--limit must be a whole number/);
    expect(run("storage", "cp", `${bucket}/x.txt`, `kiln://${bucket}/y.txt`, ...key).err).toMatch(/no such local file/);
  });
});
