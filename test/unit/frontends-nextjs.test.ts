// The Next.js framework of the frontends area (runtime-sandbox/frontends/nextjs*): what needs no build of
// the fixture app. The fixture's build (offline from the frontend npm cache the pretest fills, on Node 22,
// reserved names dropped, NEXT_PUBLIC_* inlined in the client only) and its standalone server's lifecycle
// (lazy start, sandbox, restart after a death, idle stop, stop) are tested in
// test/http/frontends-nextjs.test.ts on the one deployment Kiln builds there: a `next build` costs tens of
// CPU-seconds, and the suite builds the fixture once.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test, vi } from "vitest";
import { createNextjsFramework } from "../../runtime-sandbox/frontends/nextjs";
import { chooseNode } from "../../runtime-sandbox/frontends/nextjs/node-version";
import { FrontendBuildError, type FrontendFramework } from "../../runtime-sandbox/frontends/types";

const work = mkdtempSync(join(tmpdir(), "kiln-nextjs-test-"));
const hidden = join(work, "data-dir");
mkdirSync(hidden);
// (No server starts here, so Kiln's address is one nothing listens on.)
const framework: FrontendFramework = createNextjsFramework({
  hiddenPaths: [hidden],
  sandbox: { want: "auto", allowUnsandboxed: false },
  warn: () => {},
  kiln: () => ({ host: "127.0.0.1", port: 9, publicUrl: "http://127.0.0.1:9" }),
});

// Any registry access fails: a build must come from the prepared cache (or, here, a local folder).
vi.stubEnv("npm_config_registry", "http://127.0.0.1:9/");

afterAll(async () => {
  vi.unstubAllEnvs();
  await framework.close();
  rmSync(work, { recursive: true, force: true });
}, 120_000);

describe("Node.js version", () => {
  test("engines.node chooses 24 when it excludes 22; a range excluding both is a clear error", async () => {
    const c24 = await chooseNode(">=24");
    expect("error" in c24 ? c24.error : c24.major).toBe("24");
    const c22 = await chooseNode("^22 || ^24");
    expect("error" in c22 ? c22.error : c22.major).toBe("22");
    const bad = await chooseNode(">=26");
    expect("error" in bad && bad.error).toContain('engines.node ">=26" allows neither Node.js 22.x nor 24.x');
  });

  test("a Next.js whose engines.node refuses the chosen Node fails the build with a clear error", async () => {
    const src = join(work, "engines-src");
    mkdirSync(join(src, "fake-next"), { recursive: true });
    writeFileSync(join(src, "package.json"), JSON.stringify({ name: "engines-app", version: "1.0.0", engines: { node: "22.x" }, dependencies: { next: "file:./fake-next" } }));
    writeFileSync(join(src, "fake-next", "package.json"), JSON.stringify({ name: "next", version: "16.0.0", engines: { node: ">=99.0.0" } }));
    const out = join(work, "engines-out");
    mkdirSync(out);
    const lines: string[] = [];
    const err = await framework
      .build({ sourceDir: src, appRoot: "", outDir: out, env: {}, log: async (_l, line) => void lines.push(line), signal: new AbortController().signal })
      .then(() => null, (e: unknown) => e);
    expect(err).toBeInstanceOf(FrontendBuildError);
    expect((err as Error).message).toMatch(/^Next\.js 16\.0\.0 requires Node\.js ">=99\.0\.0" \(its package\.json engines\.node\), but this app builds and runs on Node\.js 22\.\d+\.\d+/);
    expect(lines.join("\n")).toContain("npm install --prefer-offline");
  }, 120_000);
});
