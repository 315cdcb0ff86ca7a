import { RATE_LIMITED, patchAuthConfigBody, type AuthConfig } from "../../end-users/config";
import { changeNotice, defineSection, same } from "../section";

function settings(c: AuthConfig) {
  return {
    allowed_redirect_urls: c.allowed_redirect_urls,
    allowed_email_domains: c.allowed_email_domains,
    device_verification_url: c.device_verification_url,
    require_email_confirmation: c.require_email_confirmation,
    access_token_ttl_seconds: c.access_token_ttl_seconds,
    rate_limits: Object.fromEntries(RATE_LIMITED.map((k) => [k, c.rate_limits[k]])),
  };
}

/**
 * `auth`: the end users' settings (`PATCH /auth/config`). Fields left out keep their values, as in
 * the PATCH. The end-users area makes reading them a credential read (GET /auth/config needs a
 * full-scope token), so an export for a read-only token leaves the section out.
 */
export const authSection = defineSection({
  key: "auth",
  description: "end-user settings, as PATCH /auth/config takes them",
  schema: patchAuthConfigBody.strict().describe("end users' settings; fields left out keep their values"),
  async export({ deps, project, credentials }) {
    if (!credentials) return undefined;
    return settings(await deps.authConfig.get(project.id));
  },
  async plan(want, { deps, project }) {
    const cur = settings(await deps.authConfig.get(project.id));
    const limits: Record<string, number | undefined> = { ...want.rate_limits };
    const rate_limits = Object.fromEntries(RATE_LIMITED.map((k) => [k, limits[k] ?? cur.rate_limits[k]]));
    const next = { ...cur, ...Object.fromEntries(Object.entries(want).filter(([, v]) => v !== undefined)), rate_limits };
    const changed = !same(next, cur);
    return {
      steps: [{ section: "auth", action: changed ? "updated" : "unchanged", ...(changed ? { notice: changeNotice(cur, next), run: () => deps.authConfig.update(project.id, want) } : {}) }],
      skipped: [],
      missing: [],
    };
  },
});
