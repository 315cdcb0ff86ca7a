import { pg_trgm } from "@electric-sql/pglite/contrib/pg_trgm";
import { migrate, migrationsFingerprint } from "../store/migrations";
import type { TemplateSpec } from "../store/template";
import { LOG_SCHEMA } from "./migrations";

/** The embedded log store's template: migrated, no template databases. */
export function logDbTemplate(): TemplateSpec {
  return {
    kind: "logs",
    fingerprint: migrationsFingerprint(LOG_SCHEMA),
    extensions: { pg_trgm },
    prepare: async (store) => {
      await migrate(store, LOG_SCHEMA);
    },
    drop: ["template0", "template1"],
  };
}
