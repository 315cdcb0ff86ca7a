import { defineConfig } from "vitest/config";

// Three projects: fast unit tests, and the black-box HTTP suite twice — once against the embedded
// control store (PGlite) and once against a real PostgreSQL server started for the run.
const blackBox = { include: ["test/http/**/*.test.ts"], testTimeout: 60_000, hookTimeout: 60_000 };

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
    ],
  },
});
