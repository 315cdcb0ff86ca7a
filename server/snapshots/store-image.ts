import type { PGlite } from "@electric-sql/pglite";

/**
 * The control store's rows at each snapshot, kept in memory (COPY text per table, each sequence's
 * value), so that a restore puts them back with SQL in the store that stays open, instead of
 * closing PGlite, swapping its files and opening it again (1-2 s of a restore, docs/testing.md).
 *
 * Only the tables written since an image was taken (or last restored) are put back. Which ones that
 * are comes from PostgreSQL's own per-table counters of inserted, updated and deleted rows
 * (`pg_stat_get_tuples_*`, flushed on demand): they only grow, so a table whose sum is the one the
 * image recorded was not written since. Two cheaper-looking alternatives cost far more here: asking
 * each table (a count, a look for newer row versions) is 300 ms of planning for 60 tables, and a
 * statement trigger on every table that notifies writes is seconds of DDL on each new store.
 * (Kiln never TRUNCATEs a control-store table, the one write these counters do not see.)
 */
interface TableImage {
  oid: number;
  /** Quoted, schema-qualified. */
  name: string;
  /** As in the migrations that create it (which say which area owns it). */
  relname: string;
  /** Quoted columns COPY reads and writes (generated columns are left out: they are computed). */
  columns: string;
  data: Blob | null;
}

interface StoreImage {
  tables: TableImage[];
  sequences: { name: string; value: string; called: boolean }[];
  /** Per table (same order): its write counter when the image was taken or last restored. */
  writes: string[];
}

const USER_SCHEMAS = `n.nspname not in ('pg_catalog', 'information_schema') and n.nspname not like 'pg\\_toast%' and n.nspname not like 'pg\\_temp%'`;

export class StoreImages {
  private images = new Map<string, StoreImage>();

  has(name: string): boolean {
    return this.images.has(name);
  }

  delete(name: string): void {
    this.images.delete(name);
  }

  /** Reads every table and sequence of the store. Nothing may write meanwhile (the areas are stopped). */
  async take(db: PGlite, name: string): Promise<void> {
    const image = await db.transaction(async (tx) => {
      await tx.query("set transaction isolation level repeatable read");
      // A table with no pages holds no rows: most of a fresh Kiln's tables are never written, and a
      // COPY each would cost more than all the rest of a snapshot.
      const tables = (
        await tx.query<{ oid: number; name: string; relname: string; columns: string; pages: boolean }>(
          `select c.oid::int as oid, format('%I.%I', n.nspname, c.relname) as name, c.relname::text as relname,
                (select string_agg(quote_ident(a.attname), ', ' order by a.attnum) from pg_attribute a
                  where a.attrelid = c.oid and a.attnum > 0 and not a.attisdropped and a.attgenerated = '') as columns,
                pg_relation_size(c.oid) > 0 as pages
           from pg_class c join pg_namespace n on n.oid = c.relnamespace
          where c.relkind = 'r' and c.relpersistence = 'p' and ${USER_SCHEMAS} order by 2`,
        )
      ).rows;
      const sequences = (await tx.query<{ name: string }>(`select format('%I.%I', n.nspname, c.relname) as name from pg_class c join pg_namespace n on n.oid = c.relnamespace where c.relkind = 'S' and ${USER_SCHEMAS} order by 1`)).rows;
      const image: StoreImage = { tables: [], sequences: [], writes: [] };
      for (const t of tables) {
        const r = t.pages ? await tx.query(`copy ${t.name} (${t.columns}) to '/dev/blob'`) : null;
        image.tables.push({ oid: t.oid, name: t.name, relname: t.relname, columns: t.columns, data: r?.blob?.size ? r.blob : null });
      }
      if (sequences.length) {
        const r = await tx.query<{ v: string }>(sequences.map((s) => `select last_value::text || ' ' || is_called::text as v from ${s.name}`).join(" union all "));
        r.rows.forEach((row, i) => {
          const [value, called] = row.v.split(" ");
          image.sequences.push({ name: sequences[i]!.name, value: value!, called: called === "true" });
        });
      }
      return image;
    });
    image.writes = await writeCounters(db, image);
    this.images.set(name, image);
  }

  /**
   * Puts the image's rows back into the tables written since, in one transaction, and returns their
   * names. Triggers (and the foreign-key checks, which are triggers) are off for it:
   * the rows are a consistent whole already.
   */
  async restore(db: PGlite, name: string): Promise<string[]> {
    const image = this.image(name);
    const changed = await this.written(db, image);
    await db.transaction(async (tx) => {
      await tx.query("set local session_replication_role = replica");
      // DELETE rather than TRUNCATE: a truncate refuses a table that an unchanged table references
      // (and makes new files for each table); with triggers off a delete neither checks nor cascades.
      for (const t of changed) {
        await tx.query(`delete from ${t.name}`);
        if (t.data) await tx.query(`copy ${t.name} (${t.columns}) from '/dev/blob'`, [], { blob: t.data });
      }
      if (image.sequences.length)
        await tx.query(`select ${image.sequences.map((_, i) => `setval($${3 * i + 1}::regclass, $${3 * i + 2}::bigint, $${3 * i + 3}::boolean)`).join(", ")}`, image.sequences.flatMap((s) => [s.name, s.value, s.called]));
    });
    // The restore's own deletes and copies count too: the tables it rewrote match the image now.
    // (Other images see those tables' counters grown, so they put them back in turn.)
    if (changed.length) image.writes = await writeCounters(db, image);
    return changed.map((t) => t.relname);
  }

  /** The tables written since the image was taken or last restored (what `restore` would put back), by name. */
  async changed(db: PGlite, name: string): Promise<string[]> {
    return (await this.written(db, this.image(name))).map((t) => t.relname);
  }

  private image(name: string): StoreImage {
    const image = this.images.get(name);
    if (!image) throw new Error(`no image of snapshot '${name}'`);
    return image;
  }

  private async written(db: PGlite, image: StoreImage): Promise<TableImage[]> {
    const now = await writeCounters(db, image);
    return image.tables.filter((_, i) => now[i] !== image.writes[i]);
  }
}

/**
 * Each table's inserted + updated + deleted rows so far, with every pending count flushed first.
 * Without counting (`track_counts` off) each table gets a value of its own, so all count as changed.
 */
async function writeCounters(db: PGlite, image: StoreImage): Promise<string[]> {
  const on = (await db.query<{ on: boolean }>("select current_setting('track_counts')::boolean as on, pg_stat_force_next_flush() is null as flushed")).rows[0]!.on;
  if (!on) return image.tables.map(() => crypto.randomUUID());
  const r = await db.query<{ w: string[] }>(
    `select array_agg((pg_stat_get_tuples_inserted(o) + pg_stat_get_tuples_updated(o) + pg_stat_get_tuples_deleted(o))::text order by i) as w from unnest($1::oid[]) with ordinality as u(o, i)`,
    [image.tables.map((t) => t.oid)],
  );
  return r.rows[0]!.w ?? [];
}
