// vitest globalSetup of the "s3" project: one throwaway S3 server (radosgw) for the run; every Kiln
// a test starts keeps its storage objects there, each in its own bucket.
import type { TestProject } from "vitest/node";
import { startS3Server, type S3Server } from "./s3-server";

let server: S3Server | null = null;

export default async function setup(project: TestProject) {
  const external = process.env.KILN_TEST_S3_ENDPOINT;
  if (external) {
    const u = new URL(external);
    project.provide("s3", { endPoint: `${u.protocol}//${u.host}`, accessKey: decodeURIComponent(u.username), secretKey: decodeURIComponent(u.password), region: "us-east-1" });
    return;
  }
  server = await startS3Server();
  project.provide("s3", { endPoint: server.endPoint, accessKey: server.accessKey, secretKey: server.secretKey, region: server.region });
  return async () => {
    await server?.stop();
  };
}

declare module "vitest" {
  export interface ProvidedContext {
    s3: { endPoint: string; accessKey: string; secretKey: string; region: string };
  }
}
