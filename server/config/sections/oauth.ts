import * as z from "zod";
import type { OAuthConfigView } from "../../oauth/configs";
import { PROVIDER_IDS, type ProviderId } from "../../oauth/providers";
import { createConfigBody, updateConfigBody } from "../../oauth/schemas";
import { changeNotice, defineSection, same, type Issue, type SectionContext, type SectionPlan } from "../section";

/** A provider's config as a manifest holds it: everything but the client secret (write-only). */
const entry = z
  .object({
    provider: createConfigBody.shape.provider,
    client_id: createConfigBody.shape.client_id,
    enabled: z.boolean().optional().describe("default true"),
    redirect_url: createConfigBody.shape.redirect_url.describe("required to create any provider but device"),
    scopes: createConfigBody.shape.scopes,
    issuer: updateConfigBody.shape.issuer,
  })
  .strict()
  .describe("one provider configuration (device: one device client, by client_id; only client_id and enabled). The client secret is never part of a manifest: set it with PUT /projects/{id}/oauth/configs/{provider} or `kiln auth oauth configs update`");
type Entry = z.infer<typeof entry>;

const schema = z.array(entry).max(1000).describe("the project's complete list of OAuth provider configurations (client secrets omitted)");

/** `google`, or `device/<client_id>`: how an entry is named in the report (and matched to the project's). */
const keyOf = (e: { provider: ProviderId; client_id: string }) => (e.provider === "device" ? `device/${e.client_id}` : e.provider);
const order = (a: { provider: ProviderId; client_id: string }, b: { provider: ProviderId; client_id: string }) =>
  PROVIDER_IDS.indexOf(a.provider) - PROVIDER_IDS.indexOf(b.provider) || (a.client_id < b.client_id ? -1 : a.client_id > b.client_id ? 1 : 0);

function state(c: OAuthConfigView) {
  if (c.provider === "device") return { provider: c.provider, client_id: c.client_id, enabled: c.enabled };
  // A redirect provider always has a redirect_url (create requires one).
  return { provider: c.provider, client_id: c.client_id, enabled: c.enabled, ...(c.redirect_url !== null ? { redirect_url: c.redirect_url } : {}), scopes: c.scopes, issuer: c.issuer };
}

async function configs(ctx: SectionContext) {
  return (await ctx.deps.oauthConfigs.list(ctx.project.id)).sort(order);
}

const secretNotice = (p: string) =>
  `client_secret is write-only and never part of a manifest: configure ${p} with its secret through the API (POST /projects/{id}/oauth/configs) or \`kiln auth oauth configs create ${p} --client-secret ...\`, then apply again`;

/**
 * `oauth`: the project's OAuth provider configurations through the OAuth area's service, its rules
 * included. Client secrets are write-only: exports omit them, an update never touches the stored
 * one, and a new config that needs one (every provider but device) is an error entry.
 */
export const oauthSection = defineSection<Entry[]>({
  key: "oauth",
  description: "OAuth provider configurations (client secrets are write-only and never exported)",
  schema,
  async export(ctx) {
    return (await configs(ctx)).map(state);
  },
  async validate(want, _ctx, path) {
    const issues: Issue[] = [];
    const seen = new Set<string>();
    want.forEach((e, i) => {
      const k = keyOf(e);
      if (seen.has(k)) issues.push({ path: `${path}.${i}`, message: e.provider === "device" ? `device client '${e.client_id}' is listed twice` : `provider ${e.provider} is listed twice` });
      seen.add(k);
      if (e.provider === "device")
        for (const f of ["redirect_url", "scopes", "issuer"] as const)
          if (e[f] !== undefined && e[f] !== null) issues.push({ path: `${path}.${i}.${f}`, message: "a device client takes only client_id and enabled" });
    });
    return issues;
  },
  async plan(want, ctx): Promise<SectionPlan> {
    const svc = ctx.deps.oauthConfigs;
    const projectId = ctx.project.id;
    const have = new Map((await configs(ctx)).map((c) => [keyOf(c), c]));
    const out: SectionPlan = { steps: [], skipped: [], missing: [] };
    const listed = new Set<string>();
    for (const w of [...want].sort(order)) {
      const name = keyOf(w);
      listed.add(name);
      const cur = have.get(name);
      if (!cur) {
        if (w.provider !== "device") {
          out.steps.push({ section: "oauth", name, action: "error", notice: secretNotice(w.provider) });
          continue;
        }
        out.steps.push({ section: "oauth", name, action: "created", run: () => svc.create(projectId, { provider: "device", client_id: w.client_id, enabled: w.enabled }) });
        continue;
      }
      const now = state(cur) as Record<string, unknown>;
      const next: Record<string, unknown> = { ...now };
      for (const [k, v] of Object.entries(w)) if (v !== undefined && k in now) next[k] = v;
      if (same(now, next)) {
        out.steps.push({ section: "oauth", name, action: "unchanged" });
        continue;
      }
      // Only the fields the manifest changes; client_secret is never sent, so the stored one stays.
      const patch = Object.fromEntries(Object.keys(next).filter((k) => k !== "provider" && !same(now[k], next[k])).map((k) => [k, next[k]]));
      out.steps.push({
        section: "oauth",
        name,
        action: "updated",
        notice: changeNotice(now, next),
        run: () => svc.update(projectId, cur.provider, cur.provider === "device" ? cur.client_id : undefined, patch),
      });
    }
    for (const [name, c] of have)
      if (!listed.has(name)) out.steps.push({ section: "oauth", name, action: "deleted", run: () => svc.remove(projectId, c.provider, c.provider === "device" ? c.client_id : undefined) });
    return out;
  },
});
