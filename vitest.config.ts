import { defineConfig } from "vitest/config";

// Six projects: fast unit tests; the black-box HTTP suite twice, once against the embedded control
// store (PGlite) and once against a real PostgreSQL server started for the run; and the functions
// suites with every function in a container (--function-runtime docker), once on a Docker engine and
// once on Podman's Docker-compatible API.
const blackBox = { include: ["test/http/**/*.test.ts"], exclude: ["test/http/function-containers.test.ts"], testTimeout: 60_000, hookTimeout: 60_000 };

export default defineConfig({
  test: {
    maxWorkers: 4,
    projects: [
      { test: { name: "unit", include: ["test/unit/**/*.test.ts", "server/**/*.test.ts"] } },
      { test: { ...blackBox, name: "embedded", env: { KILN_TEST_STORE: "embedded" } } },
      {
        test: {
          ...blackBox,
          name: "postgres",
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
          exclude: [],
          name: "s3",
          env: { KILN_TEST_STORE: "postgres", KILN_TEST_BLOBS: "s3" },
          globalSetup: ["test/support/global-postgres.ts", "test/support/global-s3.ts"],
        },
      },
      ...(["docker", "podman"] as const).map((engine) => ({
        test: {
          ...blackBox,
          // Durable executions in containers once (Docker): the same worker protocol, so Podman adds nothing new.
          include: ["test/http/functions.test.ts", "test/http/function-containers.test.ts", ...(engine === "docker" ? ["test/http/durable-functions.test.ts"] : [])],
          exclude: [],
          name: engine === "docker" ? "containers" : "containers-podman",
          env: { KILN_TEST_STORE: "embedded", KILN_TEST_FUNCTION_RUNTIME: "docker", KILN_TEST_CONTAINER_ENGINE: engine },
          globalSetup: ["test/support/global-container-engine.ts"],
        },
      })),
    ],
  },
});
