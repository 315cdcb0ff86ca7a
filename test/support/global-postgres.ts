// vitest globalSetup of the "postgres" project: one throwaway PostgreSQL server for the whole run;
// every Kiln a test starts gets its own database on it.
import type { TestProject } from "vitest/node";
import { findPgBin, startPgServer, type PgServer } from "./postgres-server";

let server: PgServer | null = null;

export default async function setup(project: TestProject) {
  const external = process.env.KILN_TEST_DATABASE_URL;
  if (external) {
    project.provide("pgUrl", external);
    return;
  }
  const bin = await findPgBin();
  if (!bin) throw new Error("the postgres test project needs PostgreSQL server binaries (apt-get install postgresql) or KILN_TEST_DATABASE_URL");
  server = await startPgServer({ bin });
  project.provide("pgUrl", server.url);
  return async () => {
    await server?.stop();
  };
}

declare module "vitest" {
  export interface ProvidedContext {
    pgUrl: string;
  }
}
