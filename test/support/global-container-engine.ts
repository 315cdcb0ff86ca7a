// vitest globalSetup of the container projects: an engine for --function-runtime docker, Docker
// (KILN_TEST_CONTAINER_ENGINE=docker, the default) or Podman (=podman). KILN_TEST_DOCKER_HOST /
// KILN_TEST_PODMAN_HOST name a running one (.ci/run starts dockerd); otherwise a private engine is
// started for the run and stopped after. Without either the project fails: it is never skipped.
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TestProject } from "vitest/node";

const ENGINES = {
  docker: { script: "dockerd.sh", external: "KILN_TEST_DOCKER_HOST", install: "docker.io" },
  podman: { script: "podman.sh", external: "KILN_TEST_PODMAN_HOST", install: "podman" },
};

export default async function setup(project: TestProject) {
  const engine = ENGINES[(process.env.KILN_TEST_CONTAINER_ENGINE ?? "docker") as keyof typeof ENGINES];
  if (!engine) throw new Error(`KILN_TEST_CONTAINER_ENGINE must be docker or podman`);
  const external = process.env[engine.external];
  if (external) {
    project.provide("dockerHost", external);
    return;
  }
  const script = join(import.meta.dirname, engine.script);
  // Short path: the engine's socket path must fit a unix socket address.
  const dir = mkdtempSync(join(tmpdir(), "ke-"));
  let host: string;
  try {
    host = execFileSync("bash", [script, "start", dir], { encoding: "utf8", timeout: 120_000, stdio: ["ignore", "pipe", "inherit"] }).trim();
  } catch (e) {
    throw new Error(`this test project needs a container engine (apt-get install ${engine.install}) or ${engine.external}: ${(e as Error).message}`);
  }
  project.provide("dockerHost", host);
  return async () => {
    execFileSync("bash", [script, "stop", dir], { stdio: "ignore", timeout: 60_000 });
    rmSync(dir, { recursive: true, force: true, maxRetries: 3 });
  };
}

declare module "vitest" {
  export interface ProvidedContext {
    dockerHost: string;
  }
}
