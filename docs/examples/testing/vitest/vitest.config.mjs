// The example's own configuration (the repository's vitest.config.ts would otherwise apply).
import { defineConfig } from "vitest/config";

export default defineConfig({ test: { include: ["*.test.ts"], testTimeout: 60_000, hookTimeout: 60_000 } });
