import * as z from "zod";
import { SECTIONS } from "./sections";

/** The manifest's format version: a change that old manifests cannot be read under gets a new one. */
export const MANIFEST_VERSION = 1;

/** The largest apply body (the spec's 4 MiB); larger ones are a 400. */
export const MAX_MANIFEST_BYTES = 4 * 1024 * 1024;

export const manifestSchema = z
  .object({
    version: z.literal(MANIFEST_VERSION, { error: `version must be ${MANIFEST_VERSION}` }).describe("the manifest format's version"),
    ...Object.fromEntries(SECTIONS.map((s) => [s.key, s.schema.optional().describe(`${s.description}; absent: left as it is`)])),
  })
  .strict()
  .describe(
    "A project's configuration (kiln.yaml). Every section is optional; a section that is given describes all of it (entries not listed are deleted, except functions, databases and buckets, which a manifest never creates or deletes). Keys and entries are in a fixed order, so two exports of the same state are byte-identical.",
  );
export type Manifest = { version: number } & Record<string, unknown>;

export const exportQuery = z.object({
  format: z.enum(["json", "yaml"], { error: "format must be json or yaml" }).optional().describe("yaml: the manifest as YAML (or send Accept: application/yaml)"),
});

export const applyQuery = z.object({
  dry_run: z.enum(["true", "false", "1", "0"], { error: "dry_run must be true or false" }).optional().describe("true: the projected report; nothing changes"),
});

export const applyReportSchema = z.object({
  results: z.array(
    z.object({
      section: z.string(),
      name: z.string().optional(),
      action: z.enum(["created", "updated", "deleted", "unchanged", "error"]),
      notice: z.string().optional().describe("why an entry failed; for an update, what it changes (field: old → new; values of credentials are not shown)"),
    }),
  ),
  skipped: z.array(z.object({ type: z.string(), name: z.string(), reason: z.string() })).describe("manifest entries for functions, databases or buckets the project does not have (a manifest never creates them)"),
  missing: z.array(z.object({ type: z.string(), name: z.string() })).describe("functions, databases and buckets of the project the manifest does not list (a manifest never deletes them)"),
  summary: z.object({
    created: z.number().int(),
    updated: z.number().int(),
    deleted: z.number().int(),
    unchanged: z.number().int(),
    errors: z.number().int(),
    skipped: z.number().int(),
    missing: z.number().int(),
  }),
});
export type ApplyReport = z.infer<typeof applyReportSchema>;

export const validationErrorSchema = z.object({
  error: z.string(),
  errors: z.array(z.object({ path: z.string().describe("where in the manifest, e.g. variables.2.name"), message: z.string() })),
});
