import { createHash, randomBytes } from "node:crypto";
import type { NextAuthorization, OAuthEmulatorKind, TestIdentity, TestIdentityInput } from "./api";

/** Thrown for input the emulators refuse (the HTTP layer answers 400 with its message). */
export class EmulatorInputError extends Error {}

const EMAIL = /^[^\s@]+@[^\s@]+\.[^\s@]+$/;

/** Test people shared by every emulated provider, in memory. */
export class IdentityStore {
  private byId = new Map<string, TestIdentity>();

  list(): TestIdentity[] {
    return [...this.byId.values()];
  }

  get(idOrEmail: string): TestIdentity | null {
    const key = idOrEmail.trim().toLowerCase();
    return this.byId.get(idOrEmail) ?? this.list().find((i) => i.email === key) ?? null;
  }

  upsert(input: TestIdentityInput): { identity: TestIdentity; created: boolean } {
    const email = String(input.email ?? "").trim().toLowerCase();
    if (!EMAIL.test(email)) throw new EmulatorInputError(`not an email address: '${input.email}'`);
    const picture = input.picture === undefined || input.picture === "" ? undefined : input.picture;
    if (picture != null && !/^https?:\/\//i.test(picture)) throw new EmulatorInputError("picture must be an http(s) URL");
    const existing = this.get(email);
    if (existing) {
      if (input.name !== undefined && input.name.trim()) existing.name = input.name.trim();
      if (picture !== undefined) existing.picture = picture;
      if (input.email_verified !== undefined) existing.email_verified = input.email_verified;
      return { identity: existing, created: false };
    }
    const identity: TestIdentity = {
      id: `idn_${randomBytes(8).toString("hex")}`,
      email,
      name: input.name?.trim() || email.split("@")[0]!,
      picture: picture ?? null,
      email_verified: input.email_verified ?? true,
      created_at: new Date().toISOString(),
    };
    this.byId.set(identity.id, identity);
    return { identity, created: true };
  }

  remove(id: string): boolean {
    const found = this.get(id);
    return found ? this.byId.delete(found.id) : false;
  }
}

/**
 * The provider's subject for an email: the same email always gives the same subject (across
 * restarts and emulator instances), each provider its own, shaped like the real one's.
 */
export function subjectFor(kind: OAuthEmulatorKind, email: string): string {
  const h = createHash("sha256").update(`${kind}:${email.toLowerCase()}`).digest();
  switch (kind) {
    case "google": // 21 decimal digits
      return "1" + BigInt("0x" + h.subarray(0, 9).toString("hex")).toString().padStart(20, "0").slice(-20);
    case "microsoft": // an opaque base64url string
      return h.subarray(0, 24).toString("base64url");
    case "apple": // 000123.<32 hex>.0123
      return `000${(h[0]! % 900) + 100}.${h.subarray(1, 17).toString("hex")}.${h.subarray(17, 19).toString("hex")}`;
    case "github": // a positive integer (GitHub's numeric user id), as text here
      return String(h.readUInt32BE(0) % 900_000_000 + 1_000_000);
  }
}

export interface QueuedAuthorization {
  identity: TestIdentity | null;
  deny: boolean;
  clientId?: string;
}

/** What the next authorizations do per provider, first queued first used. */
export class NextQueue {
  private queues = new Map<OAuthEmulatorKind, QueuedAuthorization[]>();

  constructor(private identities: IdentityStore) {}

  queue(kind: OAuthEmulatorKind, next: NextAuthorization): QueuedAuthorization {
    const clientId = next.client_id || undefined;
    let entry: QueuedAuthorization;
    if (next.deny) entry = { identity: null, deny: true, clientId };
    else if (typeof next.identity === "string" && next.identity) {
      const identity = this.identities.get(next.identity);
      if (!identity) throw new EmulatorInputError(`no identity '${next.identity}' (create it first, or send email, name, ... instead)`);
      entry = { identity, deny: false, clientId };
    } else if ("email" in next && next.email) {
      entry = { identity: this.identities.upsert(next).identity, deny: false, clientId };
    } else throw new EmulatorInputError("say who signs in (identity, or email) or deny: true");
    const list = this.queues.get(kind) ?? [];
    list.push(entry);
    this.queues.set(kind, list);
    return entry;
  }

  /** Takes the first entry queued for this client (or for any client). */
  take(kind: OAuthEmulatorKind, clientId: string): QueuedAuthorization | null {
    const list = this.queues.get(kind) ?? [];
    const at = list.findIndex((e) => !e.clientId || e.clientId === clientId);
    return at < 0 ? null : list.splice(at, 1)[0]!;
  }

  clear(kind: OAuthEmulatorKind): void {
    this.queues.delete(kind);
  }
}
