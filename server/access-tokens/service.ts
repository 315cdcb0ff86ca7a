import { utcDay } from "../clock";
import type { Config } from "../config";
import { badRequest, conflictCode, notFound } from "../http/errors";
import { likePattern } from "../http/pagination";
import { hashSecret, newId, newSecret, secretPrefix } from "../ids";
import { isoTimeOrNull as iso, isUniqueViolation, type ControlStore, type Row } from "../store/store";
import type { TokenUsage } from "./usage";

export type TokenScope = "full" | "read_only";

export interface TokenView {
  id: string;
  project_id: string;
  name: string;
  token_prefix: string;
  scope: TokenScope;
  status: "active" | "revoked" | "expired";
  expires_at: string | null;
  created_at: string;
  last_used_at: string | null;
  all_time_requests: number;
}


export class AccessTokensService {
  constructor(
    private readonly store: ControlStore,
    private readonly config: Config,
    private readonly now: () => Date,
    private readonly usage: TokenUsage,
    private readonly evict: (tokenId: string) => void,
  ) {}

  private view(r: Row): TokenView {
    const now = this.now().getTime();
    const status = r.revoked_at ? "revoked" : r.expires_at && new Date(r.expires_at).getTime() <= now ? "expired" : "active";
    return {
      id: r.id,
      project_id: r.project_id,
      name: r.name,
      token_prefix: r.token_prefix,
      scope: r.scope,
      status,
      expires_at: iso(r.expires_at),
      created_at: iso(r.created_at)!,
      last_used_at: iso(r.last_used_at),
      all_time_requests: r.all_time_requests,
    };
  }

  async create(projectId: string, input: { name: string; scope: TokenScope; expires_at?: string }) {
    if (input.expires_at !== undefined && Date.parse(input.expires_at) <= this.now().getTime())
      throw badRequest("expires_at must be in the future");
    const token = newSecret("pt");
    const at = this.now().toISOString();
    try {
      const row = await this.store.transaction(async (tx) => {
        await tx.query(`select id from projects where id = $1 for update`, [projectId]);
        const [{ n }] = (await tx.query(
          `select count(*)::int as n from access_tokens where project_id = $1 and revoked_at is null`,
          [projectId],
        )) as [{ n: number }];
        const [held] = await tx.query(`select 1 from access_tokens where project_id = $1 and name = $2 and revoked_at is null`, [
          projectId,
          input.name,
        ]);
        if (held) throw conflictCode("access_token_name_exists");
        if (n >= this.config.accessTokenLimit) throw conflictCode("access_token_limit_reached");
        const [r] = await tx.query(
          `insert into access_tokens (id, project_id, name, token_hash, token_prefix, scope, token_source, expires_at, created_at)
           values ($1, $2, $3, $4, $5, $6, 'api', $7::timestamptz, $8) returning *`,
          [newId(), projectId, input.name, hashSecret(token), secretPrefix(token), input.scope, input.expires_at ?? null, at],
        );
        return r!;
      });
      return { ...this.view(row), token_source: "api" as const, token };
    } catch (err) {
      if (isUniqueViolation(err)) throw conflictCode("access_token_name_exists");
      throw err;
    }
  }

  async list(projectId: string, o: { page: number; limit: number; search?: string; includeRevoked: boolean }) {
    await this.usage.flush();
    const params: unknown[] = [projectId];
    let where = `project_id = $1`;
    if (!o.includeRevoked) where += ` and revoked_at is null`;
    if (o.search) {
      params.push(likePattern(o.search));
      where += ` and name ilike $${params.length}`;
    }
    const [{ total }] = (await this.store.query(`select count(*)::int as total from access_tokens where ${where}`, params)) as [
      { total: number },
    ];
    const rows = await this.store.query(
      `select * from access_tokens where ${where} order by created_at desc, id desc limit ${o.limit} offset ${(o.page - 1) * o.limit}`,
      params,
    );
    return { data: rows.map((r) => this.view(r)), total };
  }

  private async row(projectId: string, tokenId: string): Promise<Row> {
    const [r] = await this.store.query(`select * from access_tokens where id = $1 and project_id = $2`, [tokenId, projectId]);
    if (!r) throw notFound("project access token not found");
    return r;
  }

  async get(projectId: string, tokenId: string): Promise<TokenView> {
    await this.usage.flush();
    return this.view(await this.row(projectId, tokenId));
  }

  /** Idempotent: revoking a revoked token succeeds; a token of another project is a 404. */
  async revoke(projectId: string, tokenId: string): Promise<void> {
    await this.row(projectId, tokenId);
    await this.store.query(`update access_tokens set revoked_at = $3 where id = $1 and project_id = $2 and revoked_at is null`, [
      tokenId,
      projectId,
      this.now().toISOString(),
    ]);
    this.evict(tokenId);
  }

  /** Daily request counts, one entry per UTC day, oldest first, the current day last. */
  async usageOf(projectId: string, tokenId: string, days: number) {
    await this.usage.flush();
    const r = await this.row(projectId, tokenId);
    return (await this.usageFor([r], days))[0]!;
  }

  async usageAll(projectId: string, days: number, includeRevoked: boolean) {
    await this.usage.flush();
    const rows = await this.store.query(
      `select * from access_tokens where project_id = $1 ${includeRevoked ? "" : "and revoked_at is null"} order by created_at desc, id desc`,
      [projectId],
    );
    const data = await this.usageFor(rows, days);
    return { days, data, total_requests: data.reduce((s, u) => s + u.total_requests, 0) };
  }

  private async usageFor(tokens: Row[], days: number) {
    const today = this.now();
    const dayList: string[] = [];
    for (let i = days - 1; i >= 0; i--) dayList.push(utcDay(new Date(today.getTime() - i * 86_400_000)));
    const counts = new Map<string, number>();
    if (tokens.length) {
      const ids = tokens.map((t) => t.id);
      const rows = await this.store.query(
        `select token_id, to_char(day, 'YYYY-MM-DD') as day, requests from access_token_usage
          where token_id = any($1::text[]) and day >= $2::date`,
        [ids, dayList[0]],
      );
      for (const u of rows) counts.set(`${u.token_id}/${u.day}`, u.requests);
    }
    return tokens.map((t) => {
      const daily = dayList.map((day) => ({ day, requests: counts.get(`${t.id}/${day}`) ?? 0 }));
      return { token_id: t.id as string, name: t.name as string, days, daily, total_requests: daily.reduce((s, d) => s + d.requests, 0) };
    });
  }
}
