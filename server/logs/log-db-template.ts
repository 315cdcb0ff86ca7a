import { pg_trgm } from "@electric-sql/pglite/contrib/pg_trgm";
import { migrate, migrationsFingerprint } from "../store/migrations";
import type { TemplateSpec } from "../store/template";
import { LOG_SCHEMA, TEXT_INDEX_SQL } from "./migrations";

/** The embedded log store's template: migrated, with the trigram index, no template databases. */
export function logDbTemplate(): TemplateSpec {
  return {
    kind: "logs",
    fingerprint: migrationsFingerprint([...LOG_SCHEMA, { id: "logs/text-index", sql: TEXT_INDEX_SQL.join(";\n") }]),
    extensions: { pg_trgm },
    prepare: async (store) => {
      await migrate(store, LOG_SCHEMA);
      for (const stmt of TEXT_INDEX_SQL) await store.query(stmt);
    },
    drop: ["template0", "template1"],
  };
}
