// The YAML library loads at the first manifest that needs it, not at start (it costs ~0.1 s to load).
const YAML = (): typeof import("yaml") => require("yaml");
import * as z from "zod";
import type { ManagementPrincipal } from "../auth/principal";
import type { Clock } from "../clock";
import { takeFault, type Config } from "../config";
import { jsonTooDeep, tooDeep } from "../http/body";
import { badRequest, conflict, conflictCode, forbidden, HttpError, notFound } from "../http/errors";
import type { Logger } from "../log";
import type { ProjectRecord } from "../projects/record";
import type { ControlStore } from "../store/store";
import { messageOf, type ConfigDeps, type Issue, type Missing, type SectionContext, type Skipped, type Step } from "./section";
import { SECTIONS } from "./sections";
import { MANIFEST_VERSION, manifestSchema, type ApplyReport, type Manifest } from "./schemas";

export type ManifestFormat = "json" | "yaml";

/** A manifest that failed its checks: every problem, each with its path (the 422). */
export class ManifestInvalid extends HttpError {
  constructor(readonly issues: Issue[]) {
    super(422, { error: `invalid configuration manifest: ${issues.length} problem${issues.length === 1 ? "" : "s"}: ${issues.slice(0, 3).map((i) => `${i.path || "(manifest)"}: ${i.message}`).join("; ")}${issues.length > 3 ? "; ..." : ""}` });
    (this.body as Record<string, unknown>).errors = issues;
  }
}

/** An apply left unfinished by a crash holds its project for at most this long. */
const STALE_APPLY_MS = 10 * 60_000;

/** The manifest as text: JSON with two-space indents, or YAML; both end with a newline. */
export function renderManifest(m: Manifest, format: ManifestFormat): string {
  if (format === "yaml") return YAML().stringify(m, { lineWidth: 0, aliasDuplicateObjects: false });
  return `${JSON.stringify(m, null, 2)}\n`;
}

/** Whether a parsed value nests arrays and objects deeper than `max` (a walk with its own stack). */
function deeperThan(root: unknown, max: number): boolean {
  const stack: Array<{ v: unknown; depth: number }> = [{ v: root, depth: 0 }];
  while (stack.length) {
    const { v, depth } = stack.pop()!;
    if (!v || typeof v !== "object") continue;
    if (depth + 1 > max) return true;
    for (const x of Array.isArray(v) ? v : Object.values(v)) if (x && typeof x === "object") stack.push({ v: x, depth: depth + 1 });
  }
  return false;
}

/**
 * A request body as a manifest value: YAML when its content type says so, else JSON (and YAML as the
 * fallback, so `curl --data-binary @kiln.yaml` works whatever header curl sends). A 400 when neither
 * reads, and for nesting deeper than `maxDepth` (KILN_MAX_JSON_DEPTH, as every JSON body): checked
 * before JSON is parsed, and on what YAML gave (aliases are limited to 100, so no alias bomb grows).
 */
export function parseManifestText(text: string, contentType: string | null, maxDepth = 128): unknown {
  const yamlType = /yaml/i.test(contentType ?? "");
  if (text.trim() === "") throw badRequest("the request body is empty: send a configuration manifest (JSON or YAML)");
  if (!yamlType) {
    if (jsonTooDeep(text, maxDepth)) throw tooDeep(maxDepth);
    try {
      return JSON.parse(text);
    } catch {
      if (/json/i.test(contentType ?? "")) throw badRequest("the request body is not valid JSON");
    }
  }
  const what = yamlType ? "YAML" : "JSON or YAML";
  let value: unknown;
  try {
    const doc = YAML().parseDocument(text, { uniqueKeys: true });
    if (doc.errors.length) throw badRequest(`the request body is not valid ${what}: ${doc.errors[0]!.message.split("\n")[0]}`);
    value = doc.toJS({ maxAliasCount: 100 });
  } catch (err) {
    if (err instanceof HttpError) throw err;
    // The parser's own limits (too many aliases, nesting past its stack): the body is refused, not a 500.
    throw badRequest(`the request body is not valid ${what}: ${(err as Error)?.message?.split("\n")[0] ?? "unreadable"}`);
  }
  if (deeperThan(value, maxDepth)) throw tooDeep(maxDepth);
  return value;
}

/** Strings PostgreSQL text cannot hold (a NUL, half a surrogate pair), as issues: a 422, not a failing write. */
function textIssues(root: unknown): Issue[] {
  const out: Issue[] = [];
  const stack: Array<{ v: unknown; path: string }> = [{ v: root, path: "" }];
  const at = (p: string, k: string | number) => (p ? `${p}.${k}` : String(k));
  while (stack.length && out.length < 100) {
    const { v, path } = stack.pop()!;
    const bad = (s: string) => s.includes("\0") || !s.isWellFormed();
    if (typeof v === "string") {
      if (bad(v)) out.push({ path, message: "must not contain a NUL character or half of a surrogate pair" });
    } else if (Array.isArray(v)) v.forEach((x, i) => stack.push({ v: x, path: at(path, i) }));
    else if (v && typeof v === "object")
      for (const [k, x] of Object.entries(v)) {
        if (bad(k)) out.push({ path, message: "field names must not contain a NUL character or half of a surrogate pair" });
        else stack.push({ v: x, path: at(path, k) });
      }
  }
  return out;
}

function zodIssues(error: z.ZodError): Issue[] {
  return error.issues.flatMap((i) => {
    const path = i.path.map(String);
    // An unknown key is named by its own path (a misspelt section or field), one issue each.
    if (i.code === "unrecognized_keys") return i.keys.map((k) => ({ path: [...path, k].join("."), message: `unknown field '${k}'` }));
    return [{ path: path.join("."), message: i.message.replace(/^Invalid input: /, "") }];
  });
}

/**
 * Project configuration as code: export the project's settings as a manifest, and apply one through
 * the areas' own services (their rules and validation), section by section.
 */
export class ConfigService {
  constructor(
    private readonly d: ConfigDeps & { store: ControlStore; clock: Clock; config: Config; log: Logger },
  ) {}

  private async context(projectId: string, principal: ManagementPrincipal): Promise<SectionContext> {
    const project = await this.d.projects.findVisible(projectId);
    if (!project || project.account_id !== principal.accountId) throw notFound("project not found");
    if (principal.kind === "project_token" && principal.projectId !== projectId) throw forbidden("project access token is not valid for this project");
    return {
      deps: this.d,
      project,
      principal,
      plan: await this.d.accounts.ownerPlan(principal, project.account_id),
      credentials: principal.kind === "platform" || principal.scope === "full",
    };
  }

  /** A request body (JSON or YAML) as a manifest value, under the instance's nesting limit. */
  parse(text: string, contentType: string | null): unknown {
    return parseManifestText(text, contentType, this.d.config.maxJsonDepth);
  }

  /** The project's configuration: the manifest and its text in `format`. */
  async exportConfig(projectId: string, principal: ManagementPrincipal, format: ManifestFormat = "json"): Promise<{ manifest: Manifest; text: string; contentType: string }> {
    const ctx = await this.context(projectId, principal);
    const manifest: Manifest = { version: MANIFEST_VERSION };
    for (const s of SECTIONS) {
      const value = await s.export(ctx);
      if (value !== undefined) manifest[s.key] = value;
    }
    return { manifest, text: renderManifest(manifest, format), contentType: format === "yaml" ? "application/yaml; charset=utf-8" : "application/json; charset=utf-8" };
  }

  /** Every problem of a manifest value (schema, then each section's own checks), or the parsed manifest. */
  async validate(value: unknown, ctx: SectionContext): Promise<Manifest> {
    const text = textIssues(value);
    if (text.length) throw new ManifestInvalid(text);
    const r = manifestSchema.safeParse(value);
    if (!r.success) throw new ManifestInvalid(zodIssues(r.error));
    const m = r.data as Manifest;
    const issues: Issue[] = [];
    for (const s of SECTIONS) if (m[s.key] !== undefined && s.validate) issues.push(...(await s.validate(m[s.key], ctx, s.key)));
    if (issues.length) throw new ManifestInvalid(issues);
    return m;
  }

  /**
   * Applies a manifest (`dryRun`: only the projected report). 422 with every problem and nothing
   * applied when it does not validate; 409 while another apply of the project runs. A step that fails
   * is reported as `error` with the service's message, and what was applied before it stays.
   */
  async applyConfig(projectId: string, principal: ManagementPrincipal, value: unknown, opts: { dryRun?: boolean } = {}): Promise<ApplyReport> {
    // Even a dry run is an apply request: a read-only token could otherwise learn variable values by guessing.
    if (principal.kind === "project_token" && principal.scope === "read_only") throw forbidden("project access token is read-only");
    const ctx = await this.context(projectId, principal);
    if (ctx.project.status === "deleting") throw conflictCode("project_deleting");
    const manifest = await this.validate(value, ctx);
    if (opts.dryRun) return this.report(await this.plan(manifest, ctx), false);
    const held = await this.lock(ctx.project);
    try {
      if (takeFault(this.d.config, "config-apply-hold")) await this.d.clock.sleep(60_000);
      return await this.report(await this.plan(manifest, ctx), true);
    } finally {
      await held.release();
    }
  }

  private async plan(m: Manifest, ctx: SectionContext) {
    const steps: Step[] = [];
    const skipped: Skipped[] = [];
    const missing: Missing[] = [];
    for (const s of SECTIONS) {
      if (m[s.key] === undefined) continue;
      const p = await s.plan(m[s.key], ctx);
      steps.push(...p.steps);
      skipped.push(...p.skipped);
      missing.push(...p.missing);
    }
    return { steps, skipped, missing };
  }

  private async report(p: { steps: Step[]; skipped: Skipped[]; missing: Missing[] }, run: boolean): Promise<ApplyReport> {
    const results: ApplyReport["results"] = [];
    for (const step of p.steps) {
      const entry: ApplyReport["results"][number] = { section: step.section, ...(step.name !== undefined ? { name: step.name } : {}), action: step.action, ...(step.notice ? { notice: step.notice } : {}) };
      if (run && step.run) {
        try {
          await step.run();
        } catch (err) {
          if (!(err instanceof HttpError)) this.d.log.error(`configuration apply: ${step.section} ${step.name ?? ""}`, err);
          entry.action = "error";
          entry.notice = messageOf(err);
        }
      }
      results.push(entry);
    }
    const count = (a: string) => results.filter((r) => r.action === a).length;
    return {
      results,
      skipped: p.skipped,
      missing: p.missing,
      summary: {
        created: count("created"),
        updated: count("updated"),
        deleted: count("deleted"),
        unchanged: count("unchanged"),
        errors: count("error"),
        skipped: p.skipped.length,
        missing: p.missing.length,
      },
    };
  }

  /** One apply per project at a time, across every Kiln on the store: a row per running apply (409 when taken). */
  private async lock(project: ProjectRecord): Promise<{ release(): Promise<void> }> {
    const now = this.d.clock.nowMs();
    const at = new Date(now).toISOString();
    const rows = await this.d.store.query(
      `insert into config_applies (project_id, started_at) values ($1, $2)
       on conflict (project_id) do update set started_at = excluded.started_at where config_applies.started_at < $3
       returning project_id`,
      [project.id, at, new Date(now - STALE_APPLY_MS).toISOString()],
    );
    if (!rows.length) throw conflict("another configuration apply is running for this project; retry when it has finished");
    return { release: async () => void (await this.d.store.query(`delete from config_applies where project_id = $1 and started_at = $2`, [project.id, at]).catch(() => {})) };
  }

  async removeAll(projectId: string): Promise<void> {
    await this.d.store.query(`delete from config_applies where project_id = $1`, [projectId]);
  }
}
