import { randomUUID } from "node:crypto";
import type { Command } from "commander";
import { Client } from "../client";
import { output, printObject } from "../output";
import { parseDuration } from "./clock";
import { act, appClient, keyOption as withKey, type KeyOptions } from "./shared";

/** Lock routes take a service key (full, or scoped with locks.manage), never the platform token. */
const lockClient = (c: Client, o: KeyOptions) => appClient(c, o, "a lock");

const path = (key: string, lease = false) => `/locks/${encodeURIComponent(key)}${lease ? "/lease" : ""}`;
/** Each command is one attempt: a fresh request id (repeat safety comes from the lock token). */
const ids = (lockToken?: string): Record<string, string> => ({
  "X-Service-Request-Id": randomUUID(),
  ...(lockToken ? { "X-Service-Lock-Token": lockToken } : {}),
});

function ttlOf(v: string): number {
  const s = parseDuration(v);
  if (!Number.isInteger(s)) throw new Error(`--ttl must be a whole number of seconds (got '${v}')`);
  return s;
}

export function locksCommand(program: Command): void {
  const cmd = program
    .command("locks")
    .description("project locks: leases with fencing tokens for coordinating workers (service key: --key or KILN_SERVICE_KEY)");
  const keyOption = (c: Command) => withKey(c, "service key of the project (or KILN_SERVICE_KEY); full, or scoped with locks.manage");

  keyOption(
    cmd
      .command("acquire <key>")
      .description("take the lock (or reset the expiry of your own lease); prints the lock token to renew and release with")
      .requiredOption("--ttl <duration>", "lease length: 5 s to 90 days (30, 5m, 1h)")
      .option("--lock-token <uuid>", "your lock token (default: a new random UUID)"),
  ).action(
    act(async (c, g, key: string, o: { ttl: string; lockToken?: string; key?: string; serviceKey?: string }) => {
      const lockToken = o.lockToken ?? randomUUID();
      const r = await lockClient(c, o).request("POST", path(key, true), { ttl_seconds: ttlOf(o.ttl) }, ids(lockToken));
      const out = { key, lock_token: lockToken, ...r };
      output(g.json, out, () => printObject(out));
    }),
  );
  keyOption(
    cmd
      .command("renew <key>")
      .description("extend your lease to now + TTL (more than one second before it expires)")
      .requiredOption("--lock-token <uuid>", "the lock token the lease was acquired with")
      .requiredOption("--ttl <duration>", "new lease length from now: 5 s to 90 days"),
  ).action(
    act(async (c, g, key: string, o: { ttl: string; lockToken: string; key?: string; serviceKey?: string }) => {
      const r = await lockClient(c, o).request("PATCH", path(key, true), { ttl_seconds: ttlOf(o.ttl) }, ids(o.lockToken));
      const out = { key, lock_token: o.lockToken, ...r };
      output(g.json, out, () => printObject(out));
    }),
  );
  keyOption(
    cmd
      .command("release <key>")
      .description("release your lease (succeeds, and changes nothing, when the lock is free or held under another token)")
      .requiredOption("--lock-token <uuid>", "the lock token the lease was acquired with"),
  ).action(
    act(async (c, g, key: string, o: { lockToken: string; key?: string; serviceKey?: string }) => {
      await lockClient(c, o).request("DELETE", path(key, true), undefined, ids(o.lockToken));
      output(g.json, { key, released: true }, () => console.log(`Released ${key} (if ${o.lockToken} held it)`));
    }),
  );
  keyOption(cmd.command("get <key>").description("whether the lock is held, and if so until when and under which fencing token")).action(
    act(async (c, g, key: string, o: { key?: string; serviceKey?: string }) => {
      const r = await lockClient(c, o).request("GET", path(key), undefined, ids());
      output(g.json, r, () => printObject({ key, ...r }));
    }),
  );
  keyOption(cmd.command("force-release <key>").description("free the lock whoever holds it (the holder finds out at its next renewal)")).action(
    act(async (c, g, key: string, o: { key?: string; serviceKey?: string }) => {
      await lockClient(c, o).request("DELETE", path(key), undefined, ids());
      output(g.json, { key, released: true }, () => console.log(`Force-released ${key}`));
    }),
  );
}
