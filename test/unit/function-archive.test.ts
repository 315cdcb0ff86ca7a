import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { ArchiveError, extractSource, inferRoots, normalizeSource } from "../../server/functions/archive";

const work = mkdtempSync(join(tmpdir(), "kiln-archive-test-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));
let n = 0;

/** Writes files into a fresh folder and packs it with the system zip or tar, as users would. */
function pack(kind: "zip" | "tgz", files: Record<string, string>, extra?: (dir: string) => void): Uint8Array {
  const dir = join(work, `src-${++n}`);
  for (const [p, content] of Object.entries(files)) {
    mkdirSync(dirname(join(dir, p)), { recursive: true });
    writeFileSync(join(dir, p), content);
  }
  mkdirSync(dir, { recursive: true });
  extra?.(dir);
  const out = join(work, `a-${n}.${kind}`);
  if (kind === "zip") execFileSync("zip", ["-qry", out, "."], { cwd: dir });
  else execFileSync("tar", ["-czf", out, "-C", dir, "."]);
  return readFileSync(out);
}

const limits = { uploadBytes: 5 * 1_048_576, normalizedBytes: 5 * 1_048_576, extractedBytes: 20 * 1_048_576 };
const norm = (buf: Uint8Array, runtime = "nodejs22.x") => normalizeSource(buf, { runtime, handler: "handler", limits });

async function unpack(tarGz: Uint8Array): Promise<Record<string, string>> {
  const dir = join(work, `out-${++n}`);
  mkdirSync(dir);
  await extractSource(tarGz, dir);
  const out: Record<string, string> = {};
  const walk = (d: string, prefix = "") => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const rel = prefix ? `${prefix}/${e.name}` : e.name;
      if (e.isDirectory()) walk(join(d, e.name), rel);
      else out[rel] = readFileSync(join(d, e.name), "utf8");
    }
  };
  walk(dir);
  return out;
}

describe("normalizeSource", () => {
  test.each(["zip", "tgz"] as const)("%s: keeps sources, drops installed dependencies, writes function-build.json", async (kind) => {
    const r = await norm(
      pack(kind, {
        "index.js": "exports.handler = async () => 1",
        "package.json": "{}",
        "lib/util.js": "x",
        "node_modules/left-pad/index.js": "y",
        "lib/vendor/thing.rb": "z",
        ".venv/bin/python": "p",
      }),
    );
    expect(r.files).toEqual([".service/function-build.json", "index.js", "lib/util.js", "package.json"]);
    expect(r.dropped).toEqual([".venv", "lib/vendor", "node_modules"]);
    expect(r.build).toEqual({ function_root: ".", install_root: ".", entry: "index.js", runtime: "nodejs22.x", handler: "handler" });
    const files = await unpack(r.tarGz);
    expect(JSON.parse(files[".service/function-build.json"]!)).toEqual(r.build);
    expect(files["index.js"]).toBe("exports.handler = async () => 1");
    expect(r.sha256).toMatch(/^[0-9a-f]{64}$/);
  });

  test("the same source gives the same bytes, whatever the archive format", async () => {
    const files = { "main.py": "def handler(e, c): return 1", "requirements.txt": "" };
    const a = await norm(pack("zip", files), "python3.11");
    const b = await norm(pack("tgz", files), "python3.11");
    expect(a.sha256).toBe(b.sha256);
  });

  test.each(["zip", "tgz"] as const)("%s: symlinks are refused", async (kind) => {
    const buf = pack(kind, { "index.js": "x" }, (dir) => symlinkSync("/etc/passwd", join(dir, "passwd")));
    await expect(norm(buf)).rejects.toThrow(/symlink/);
  });

  test("paths escaping the root, garbage and empty archives are refused", async () => {
    const dir = join(work, "evil");
    mkdirSync(join(dir, "a"), { recursive: true });
    writeFileSync(join(work, "outside.js"), "x");
    execFileSync("tar", ["-czf", join(work, "evil.tgz"), "-C", dir, "-P", "../outside.js"]);
    await expect(norm(readFileSync(join(work, "evil.tgz")))).rejects.toThrow(/escapes the archive root/);
    await expect(norm(new TextEncoder().encode("not an archive"))).rejects.toThrow(/ZIP or tar\.gz/);
    await expect(norm(pack("tgz", {}))).rejects.toThrow(/no files/);
  });

  test("size limits apply to the upload, the unpacked content and the normalized archive", async () => {
    const big = pack("tgz", { "index.js": "x".repeat(300_000) });
    await expect(normalizeSource(big, { runtime: "nodejs22.x", handler: "handler", limits: { ...limits, uploadBytes: 100 } })).rejects.toThrow(ArchiveError);
    await expect(normalizeSource(big, { runtime: "nodejs22.x", handler: "handler", limits: { ...limits, extractedBytes: 100_000 } })).rejects.toThrow(/unpacks to more than/);
    const random = pack("tgz", { "index.js": Buffer.from(crypto.getRandomValues(new Uint8Array(60_000))).toString("base64") });
    await expect(normalizeSource(random, { runtime: "nodejs22.x", handler: "handler", limits: { ...limits, normalizedBytes: 10_000 } })).rejects.toThrow(/normalized source archive is larger/);
  });

  test("the reserved .service-dependencies path is accepted and flagged; an uploaded build file is replaced", async () => {
    const r = await norm(pack("zip", { "index.js": "x", ".service-dependencies/x": "y", ".service/function-build.json": '{"function_root":"/etc"}' }));
    expect(r.reservedPath).toBe(true);
    expect(r.build.function_root).toBe(".");
    expect(JSON.parse((await unpack(r.tarGz))[".service/function-build.json"]!).function_root).toBe(".");
  });
});

describe("rule 6: function and install roots", () => {
  test("the single entry file decides the function root; the closest manifest above it the install root", () => {
    expect(inferRoots(["packages/api/index.js", "package.json", "packages/web/app.js"], "nodejs22.x")).toEqual({
      function_root: "packages/api",
      install_root: ".",
      entry: "index.js",
    });
    expect(inferRoots(["svc/main.py", "svc/requirements.txt", "README.md"], "python3.12")).toEqual({ function_root: "svc", install_root: "svc", entry: "main.py" });
    expect(inferRoots(["app/main.rb"], "ruby3.3")).toEqual({ function_root: "app", install_root: "app", entry: "main.rb" });
  });
  test("without a single entry, the only top-level directory; otherwise the root", () => {
    expect(inferRoots(["fn/a.js", "fn/b/index.js", "fn/c/index.js"], "nodejs22.x").function_root).toBe("fn");
    expect(inferRoots(["a/index.js", "b/index.js"], "nodejs22.x")).toMatchObject({ function_root: ".", entry: null });
    expect(inferRoots(["index.mjs", "package.json"], "nodejs24.x")).toMatchObject({ function_root: ".", entry: "index.mjs" });
  });
});
