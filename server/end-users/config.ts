import * as z from "zod";
import type { ControlStore } from "../store/store";
import { redirectUrlProblem } from "./redirect-url";

/** End-user endpoints that are rationed per project and client address, in hourly windows. */
export const RATE_LIMITED = ["signup", "signin", "refresh", "forgot_password", "reset_password", "change_email"] as const;
export type RateLimited = (typeof RATE_LIMITED)[number];

/** Requests per hour per client address, until a project sets its own. */
export const DEFAULT_RATE_LIMITS: Record<RateLimited, number> = {
  signup: 100,
  signin: 300,
  refresh: 1800,
  forgot_password: 30,
  reset_password: 30,
  change_email: 30,
};

const redirectUrl = z.string().superRefine((u, ctx) => {
  const problem = redirectUrlProblem(u);
  if (problem) ctx.addIssue({ code: "custom", message: `'${u}' ${problem}` });
});
const domain = z
  .string()
  .trim()
  .toLowerCase()
  .regex(/^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$/, "must be a domain name such as example.com");

export const authConfigSchema = z.object({
  allowed_redirect_urls: z.array(z.string()),
  allowed_email_domains: z.array(z.string()).describe("empty: any domain"),
  device_verification_url: z.string().nullable(),
  require_email_confirmation: z.boolean(),
  access_token_ttl_seconds: z.number().int(),
  rate_limits: z.object(Object.fromEntries(RATE_LIMITED.map((k) => [k, z.number().int()])) as Record<RateLimited, z.ZodNumber>),
  updated_at: z.string().nullable(),
});
export type AuthConfig = z.infer<typeof authConfigSchema>;

export const patchAuthConfigBody = z.object({
  allowed_redirect_urls: z.array(redirectUrl).max(100).optional(),
  allowed_email_domains: z.array(domain).max(100).optional(),
  device_verification_url: redirectUrl.nullable().optional(),
  require_email_confirmation: z.boolean().optional(),
  access_token_ttl_seconds: z.number().int().min(60, "must be at least 60").max(86_400, "must be at most 86400").optional(),
  rate_limits: z
    .object(
      Object.fromEntries(RATE_LIMITED.map((k) => [k, z.number().int().min(1).max(1_000_000).optional()])) as Record<
        RateLimited,
        z.ZodOptional<z.ZodNumber>
      >,
    )
    .strict()
    .optional(),
});
export type AuthConfigPatch = z.infer<typeof patchAuthConfigBody>;

export function defaultAuthConfig(): AuthConfig {
  return {
    allowed_redirect_urls: [],
    allowed_email_domains: [],
    device_verification_url: null,
    require_email_confirmation: false,
    access_token_ttl_seconds: 3600,
    rate_limits: { ...DEFAULT_RATE_LIMITS },
    updated_at: null,
  };
}

/** Per-project end-user settings, read on every auth request (cached; writes evict). */
export class AuthConfigService {
  private readonly cache = new Map<string, AuthConfig>();

  /** Forgets every cached setting (a snapshot restore put back the rows). */
  forgetAll(): void {
    this.cache.clear();
  }

  constructor(
    private readonly store: ControlStore,
    private readonly now: () => Date,
  ) {}

  async get(projectId: string): Promise<AuthConfig> {
    const hit = this.cache.get(projectId);
    if (hit) return hit;
    const [row] = await this.store.query(`select config, updated_at from auth_config where project_id = $1`, [projectId]);
    const base = defaultAuthConfig();
    const cfg: AuthConfig = row
      ? { ...base, ...row.config, rate_limits: { ...base.rate_limits, ...row.config.rate_limits }, updated_at: new Date(row.updated_at).toISOString() }
      : base;
    this.cache.set(projectId, cfg);
    return cfg;
  }

  async update(projectId: string, patch: AuthConfigPatch): Promise<AuthConfig> {
    const cur = await this.get(projectId);
    const { updated_at: _, ...rest } = cur;
    const next = { ...rest, ...stripUndefined(patch), rate_limits: { ...cur.rate_limits, ...stripUndefined(patch.rate_limits ?? {}) } };
    const at = this.now().toISOString();
    await this.store.query(
      `insert into auth_config (project_id, config, updated_at) values ($1, $2::text::jsonb, $3)
       on conflict (project_id) do update set config = excluded.config, updated_at = excluded.updated_at`,
      [projectId, JSON.stringify(next), at],
    );
    this.cache.delete(projectId);
    return this.get(projectId);
  }

  async remove(projectId: string): Promise<void> {
    await this.store.query(`delete from auth_config where project_id = $1`, [projectId]);
    this.cache.delete(projectId);
  }
}

function stripUndefined<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}
