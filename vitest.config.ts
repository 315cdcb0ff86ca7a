import { defineConfig } from "vitest/config";

// Four projects: fast unit tests; the black-box HTTP suite twice, once against the embedded control
// store (PGlite) and once against a real PostgreSQL server started for the run; and the functions
// suite once more with every function in a container on a Docker engine (--function-runtime docker).
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
      {
        test: {
          ...blackBox,
          include: ["test/http/functions.test.ts", "test/http/function-containers.test.ts"],
          exclude: [],
          name: "containers",
          env: { KILN_TEST_STORE: "embedded", KILN_TEST_FUNCTION_RUNTIME: "docker" },
          globalSetup: ["test/support/global-docker.ts"],
        },
      },
    ],
  },
});
