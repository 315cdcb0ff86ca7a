// pg-copy-streams ships no types: the two functions the database suites use. A query object for
// node-postgres's client.query() that is also the COPY's stream.
declare module "pg-copy-streams" {
  import type { Readable, Writable } from "node:stream";
  import type { Submittable } from "pg";
  export function from(sql: string): Writable & Submittable;
  export function to(sql: string): Readable & Submittable;
}
