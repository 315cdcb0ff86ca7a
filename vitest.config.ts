import { defineConfig } from "vitest/config";
import JSC_OPTIONS from "./cmd/jsc-options.json";

// The test fixture's JavaScriptCore options (cmd/jsc-options.json, as kiln/testing sets them) for every test
// process and every Kiln they start: the workers are forked after this runs, with this environment.
for (const [k, v] of Object.entries(JSC_OPTIONS)) process.env[k] ??= v;
// Bun's allocator (mimalloc) never hands freed pages back to the kernel in the suite's processes.
// Handing them back and faulting them in again is much of a short-lived process's system time on a
// VM where page faults are dear (measured, CPU of vitest and its Kilns: database-branches.test 47.0
// -> 40.8 s, projects.test 13.0 -> 11.5 s with the Kilns alone; an API write 2.9 -> 2.2 ms of Kiln
// CPU), at the price of a resident set that stays at its peak, which a process living seconds
// never minds. Kiln's own default is unchanged: tests that measure Kiln's memory start it with
// PRODUCT_ALLOCATOR (test/support/kiln.ts).
process.env.MIMALLOC_PURGE_DELAY ??= "-1";

// Six projects: fast unit tests; the black-box HTTP suite twice, once against the embedded control
// store (PGlite) and once against a real PostgreSQL server started for the run; and the functions
// suites with every function in a container (--function-runtime docker), once on a Docker engine and
// once on Podman's Docker-compatible API.
const blackBox = { include: ["test/http/**/*.test.ts"], exclude: ["test/http/function-containers.test.ts"], testTimeout: 60_000, hookTimeout: 60_000 };

export default defineConfig({
  test: {
    // The suite is CPU-bound on the 2-core runner (every file starts Kilns). Clean-clone CI runs in one
    // session (2026-11-27), vitest's duration: 4 workers 932, 941, 944 s; 3 workers 891, 883 s; 2 workers
    // 915 s. Fewer workers also means fewer Kilns sharing the cores at once.
    maxWorkers: 3,
    projects: [
      // Unit tests start sandboxes and databases too: 5 s is not enough on a loaded 2-core runner.
      { test: { name: "unit", include: ["test/unit/**/*.test.ts", "server/**/*.test.ts"], testTimeout: 30_000 } },
      { test: { ...blackBox, name: "embedded", env: { KILN_TEST_STORE: "embedded" } } },
      {
        test: {
          ...blackBox,
          name: "postgres",
          // Files whose behaviour does not depend on the store run once, on the embedded one: the CLI
          // suites (a client of the same API), archives and the sandbox, HTTP conventions, body limits,
          // the OpenAPI document, mail, the OAuth emulators' login page in a browser (the emulators keep
          // nothing in the store), OAuth sign-in in a browser (the pages; oauth-flow.test runs the same
          // flows over HTTP on both stores), a static frontend in the browser (frontends.test covers both
          // stores), the web console in a browser (console, console-observability: a client of the public
          // API, whose routes the other files test on both stores); storage runs on PostgreSQL in the s3 project below. The compiled
          // binary's test (binary) runs its embedded profile.
          exclude: [
            ...blackBox.exclude,
            ...["cli", "storage-cli", "durable-cli", "function-archives", "function-sandbox", "conventions", "limits", "openapi", "mail-delivery", "oauth-emulators-browser", "oauth-browser", "frontends-browser", "console", "console-observability", "storage", "storage-memory", "binary"].map((f) => `test/http/${f}.test.ts`),
            // The Next.js build and server do not touch the store (the area's own files run on both), and a
            // `next build` costs tens of CPU-seconds: once.
            "test/http/frontends-nextjs.test.ts",
          ],
          env: { KILN_TEST_STORE: "postgres" },
          globalSetup: ["test/support/global-postgres.ts"],
        },
      },
      // The storage suites again with objects on S3 (radosgw started for the run), on the PostgreSQL store:
      // the production profile's storage.
      {
        test: {
          ...blackBox,
          include: ["test/http/storage*.test.ts"],
          exclude: ["test/http/storage-cli.test.ts"],
          name: "s3",
          env: { KILN_TEST_STORE: "postgres", KILN_TEST_BLOBS: "s3" },
          globalSetup: ["test/support/global-postgres.ts", "test/support/global-s3.ts"],
        },
      },
      ...(["docker", "podman"] as const).map((engine) => ({
        test: {
          ...blackBox,
          // Invocation and durable executions in containers once (Docker); Podman runs the engine-specific
          // file (its Docker-compatible API, image import, labels, cleanup): the rest is the same API calls.
          include: ["test/http/function-containers.test.ts", ...(engine === "docker" ? ["test/http/functions.test.ts", "test/http/durable-functions.test.ts"] : [])],
          exclude: [],
          name: engine === "docker" ? "containers" : "containers-podman",
          env: { KILN_TEST_STORE: "embedded", KILN_TEST_FUNCTION_RUNTIME: "docker", KILN_TEST_CONTAINER_ENGINE: engine },
          globalSetup: ["test/support/global-container-engine.ts"],
        },
      })),
    ],
  },
});
