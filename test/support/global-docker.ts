// vitest globalSetup of the "containers" project: a Docker engine for --function-runtime docker.
// KILN_TEST_DOCKER_HOST names one (.ci/run starts it); otherwise a private dockerd is started for the
// run and stopped after. Without either the project fails: the container runtime is never skipped.
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TestProject } from "vitest/node";

const SCRIPT = join(import.meta.dirname, "dockerd.sh");

export default async function setup(project: TestProject) {
  const external = process.env.KILN_TEST_DOCKER_HOST;
  if (external) {
    project.provide("dockerHost", external);
    return;
  }
  // Short path: the engine's socket path must fit a unix socket address.
  const dir = mkdtempSync(join(tmpdir(), "kd-"));
  let host: string;
  try {
    host = execFileSync("bash", [SCRIPT, "start", dir], { encoding: "utf8", timeout: 120_000, stdio: ["ignore", "pipe", "inherit"] }).trim();
  } catch (e) {
    throw new Error(`the containers test project needs a Docker engine (apt-get install docker.io) or KILN_TEST_DOCKER_HOST: ${(e as Error).message}`);
  }
  project.provide("dockerHost", host);
  return async () => {
    execFileSync("bash", [SCRIPT, "stop", dir], { stdio: "ignore", timeout: 60_000 });
    rmSync(dir, { recursive: true, force: true, maxRetries: 3 });
  };
}

declare module "vitest" {
  export interface ProvidedContext {
    dockerHost: string;
  }
}
