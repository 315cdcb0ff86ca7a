import type { Clock } from "../clock";
import { badRequest, conflict, forbidden, notFound } from "../http/errors";
import { newId } from "../ids";
import type { Logger } from "../log";
import { isoTime, isUniqueViolation, type ControlStore, type Row, type Sql } from "../store/store";
import { checkPolicyDefinition } from "./policy-expression";

export type PolicyOperation = "SELECT" | "INSERT" | "UPDATE" | "DELETE";

/** Who asks, as policies see them: `auth.role()` is `anon` or `authenticated`; service keys never reach policies. */
export interface PolicyCaller {
  role: "anon" | "authenticated";
  uid: string | null;
  email: string | null;
}

/** The object (or the object to be) a policy decides on. */
export interface PolicyCandidate {
  bucket_id: string;
  name: string;
  owner_id: string | null;
  size: number;
  mime_type: string;
  is_public: boolean;
  metadata: Record<string, unknown>;
}

export const DENIED = "access denied by storage policy";

export function policyView(p: Row) {
  return { id: p.id as string, bucket_id: p.bucket_id as string, name: p.name as string, operation: p.operation as PolicyOperation, definition: p.definition as string, created_at: isoTime(p.created_at) };
}

/**
 * Storage policies: stored after `checkPolicyDefinition` accepted them, evaluated by the control
 * store's PostgreSQL in a read-only transaction whose settings carry the caller (auth.uid() and
 * friends). Several policies for one operation: any one that holds allows it.
 */
export class PoliciesService {
  constructor(
    private readonly store: ControlStore,
    private readonly clock: Clock,
    private readonly log: Logger,
  ) {}

  async create(projectId: string, bucketId: string, body: { name: string; operation: PolicyOperation; definition: string }) {
    const checked = await checkPolicyDefinition(body.definition);
    if (!checked.ok) throw badRequest(`invalid request: body field 'definition': ${checked.error}`);
    // The allow-list passed; PostgreSQL checks names and types (a column compared with the wrong type, say).
    try {
      await this.store.transaction(async (tx) => {
        await tx.query(`set transaction read only`);
        await tx.query(`select (${checked.sql}) as ok from ${candidateRow()} limit 0`, candidateParams(EMPTY_CANDIDATE));
      });
    } catch (err) {
      throw badRequest(`invalid request: body field 'definition': ${(err as Error).message}`);
    }
    try {
      const [r] = await this.store.query(
        `insert into storage_policies (id, project_id, bucket_id, name, operation, definition, created_at) values ($1, $2, $3, $4, $5, $6, $7) returning *`,
        [newId(), projectId, bucketId, body.name, body.operation, body.definition.trim(), this.clock.now().toISOString()],
      );
      return policyView(r!);
    } catch (err) {
      if (isUniqueViolation(err)) throw conflict(`a policy named '${body.name}' already exists on this bucket`);
      throw err;
    }
  }

  async list(bucketId: string) {
    return (await this.store.query(`select * from storage_policies where bucket_id = $1 order by created_at, id`, [bucketId])).map(policyView);
  }

  async delete(bucketId: string, policyId: string): Promise<void> {
    const rows = await this.store.query(`delete from storage_policies where bucket_id = $1 and id = $2 returning id`, [bucketId, policyId]);
    if (!rows.length) throw notFound("policy not found");
  }

  /** The bucket's definitions for an operation, OR-ed; null when there is none (nothing is allowed). */
  async expression(bucketId: string, operation: PolicyOperation): Promise<string | null> {
    const rows = await this.store.query<{ definition: string }>(`select definition from storage_policies where bucket_id = $1 and operation = $2 order by created_at, id`, [bucketId, operation]);
    if (!rows.length) return null;
    // Each was checked whole when stored; re-checked here so a row written by other means cannot inject.
    const parts: string[] = [];
    for (const r of rows) {
      const c = await checkPolicyDefinition(r.definition);
      if (c.ok) parts.push(c.sql);
    }
    return parts.length ? parts.join(" or ") : null;
  }

  /** Runs `fn` in a read-only transaction that carries the caller for auth.uid(), auth.role(), auth.email(). */
  async asCaller<T>(caller: PolicyCaller, fn: (tx: Sql) => Promise<T>): Promise<T> {
    return this.store.transaction(async (tx) => {
      await tx.query(`set transaction read only`);
      await tx.query(`select set_config('kiln.uid', $1, true), set_config('kiln.role', $2, true), set_config('kiln.email', $3, true)`, [caller.uid ?? "", caller.role, caller.email ?? ""]);
      return fn(tx);
    });
  }

  /** Whether the bucket's policies for `operation` allow this caller this object; throws the spec's 403 when not. */
  async require(operation: PolicyOperation, caller: PolicyCaller, candidate: PolicyCandidate): Promise<void> {
    if (!(await this.allows(operation, caller, candidate))) throw forbidden(DENIED);
  }

  async allows(operation: PolicyOperation, caller: PolicyCaller, candidate: PolicyCandidate): Promise<boolean> {
    const expr = await this.expression(candidate.bucket_id, operation);
    if (!expr) return false;
    try {
      const [r] = await this.asCaller(caller, (tx) => tx.query<{ ok: boolean | null }>(`select (${expr}) as ok from ${candidateRow()}`, candidateParams(candidate)));
      return r?.ok === true;
    } catch (err) {
      // A policy that fails at run time (a cast of a value it did not expect, say) allows nothing.
      this.log.warn(`storage policy on bucket ${candidate.bucket_id} (${operation}) failed: ${(err as Error).message}`);
      return false;
    }
  }
}

const EMPTY_CANDIDATE: PolicyCandidate = { bucket_id: "", name: "", owner_id: null, size: 0, mime_type: "", is_public: false, metadata: {} };

/** One row with the policy columns, all bound as parameters $1-$7. */
function candidateRow(): string {
  return `(select $1::text as bucket_id, $2::text as name, $3::text as owner_id, $4::bigint as size, $5::text as mime_type, $6::boolean as is_public, $7::text::jsonb as metadata) as o`;
}

function candidateParams(c: PolicyCandidate): unknown[] {
  return [c.bucket_id, c.name, c.owner_id, c.size, c.mime_type, c.is_public, JSON.stringify(c.metadata)];
}
