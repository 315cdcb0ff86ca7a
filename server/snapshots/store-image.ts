import type { PGlite } from "@electric-sql/pglite";

/**
 * The control store's rows at each snapshot, kept in memory (COPY text per table, each sequence's
 * value), so that a restore puts them back with SQL in the store that stays open, instead of
 * closing PGlite, swapping its files and opening it again (1-2 s of a restore, docs/testing.md).
 *
 * Only the tables written since an image was taken (or last restored) are put back. Which ones that
 * are is known without reading them: a statement trigger on every table notifies
 * `kiln_snapshot_writes` with the table's name when a write commits (a rolled-back write changed
 * nothing and notifies nothing), and this process listens. Asking the tables instead (a count and a
 * look for newer row versions in each) costs hundreds of milliseconds of planning for 60 tables.
 */
interface TableImage {
  /** Quoted, schema-qualified. */
  name: string;
  /** Quoted columns COPY reads and writes (generated columns are left out: they are computed). */
  columns: string;
  data: Blob | null;
}

interface StoreImage {
  tables: Map<string, TableImage>;
  sequences: { name: string; value: string; called: boolean }[];
  /** Tables written since the image was taken or last restored; "all" when that is not known. */
  dirty: Set<string> | "all";
}

const CHANNEL = "kiln_snapshot_writes";
const TRIGGER = "kiln_snapshot_writes";
const USER_SCHEMAS = `n.nspname not in ('pg_catalog', 'information_schema') and n.nspname not like 'pg\\_toast%' and n.nspname not like 'pg\\_temp%'`;
const TABLES = `from pg_class c join pg_namespace n on n.oid = c.relnamespace where c.relkind in ('r', 'p') and c.relpersistence = 'p' and ${USER_SCHEMAS}`;

export class StoreImages {
  private images = new Map<string, StoreImage>();
  /** The PGlite instance whose writes are being noted (a full restore opens a new one). */
  private watched: PGlite | null = null;

  has(name: string): boolean {
    return this.images.has(name);
  }

  delete(name: string): void {
    this.images.delete(name);
  }

  /** Reads every table and sequence of the store. Nothing may write meanwhile (the areas are stopped). */
  async take(db: PGlite, name: string): Promise<void> {
    await this.watch(db);
    const image = await db.transaction(async (tx) => {
      await tx.query("set transaction isolation level repeatable read");
      const tables = (await tx.query<{ key: string; name: string; columns: string }>(
        `select n.nspname || '.' || c.relname as key, format('%I.%I', n.nspname, c.relname) as name,
                (select string_agg(quote_ident(a.attname), ', ' order by a.attnum) from pg_attribute a
                  where a.attrelid = c.oid and a.attnum > 0 and not a.attisdropped and a.attgenerated = '') as columns
           ${TABLES} order by 1`,
      )).rows;
      const sequences = (await tx.query<{ name: string }>(`select format('%I.%I', n.nspname, c.relname) as name from pg_class c join pg_namespace n on n.oid = c.relnamespace where c.relkind = 'S' and ${USER_SCHEMAS} order by 1`)).rows;
      const image: StoreImage = { tables: new Map(), sequences: [], dirty: new Set() };
      for (const t of tables) {
        const r = await tx.query(`copy ${t.name} (${t.columns}) to '/dev/blob'`);
        image.tables.set(t.key, { name: t.name, columns: t.columns, data: r.blob?.size ? r.blob : null });
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
    this.images.set(name, image);
  }

  /**
   * Puts the image's rows back into the tables written since, in one transaction, and returns how
   * many tables that was. Triggers (and the foreign-key checks, which are triggers) are off for it:
   * the rows are a consistent whole already, and the restore's own writes notify nothing.
   */
  async restore(db: PGlite, name: string): Promise<number> {
    const image = this.images.get(name);
    if (!image) throw new Error(`no image of snapshot '${name}'`);
    if (this.watched !== db) await this.watch(db);
    const changed = image.dirty === "all" ? [...image.tables.values()] : [...image.dirty].flatMap((k) => image.tables.get(k) ?? []);
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
    image.dirty = new Set();
    // What this restore rewrote differs from every other image now.
    const keys = [...image.tables.entries()].filter(([, t]) => changed.includes(t)).map(([k]) => k);
    for (const other of this.images.values()) if (other !== image) this.note(other, keys);
    return changed.length;
  }

  private note(image: StoreImage, keys: Iterable<string>): void {
    if (image.dirty === "all") return;
    for (const k of keys) image.dirty.add(k);
  }

  /**
   * Puts the write trigger on every table that lacks it and listens. A new store instance (a restore
   * from files) means the images' notion of what changed is lost: they are put back whole once.
   */
  private async watch(db: PGlite): Promise<void> {
    if (this.watched === db) return;
    for (const image of this.images.values()) image.dirty = "all";
    await db.exec(`
      create or replace function kiln_snapshot_note_write() returns trigger language plpgsql as $$
      begin
        perform pg_notify('${CHANNEL}', tg_table_schema || '.' || tg_table_name);
        return null;
      end $$;
      do $$
      declare r record;
      begin
        for r in select format('%I.%I', n.nspname, c.relname) as name ${TABLES}
                   and not exists (select 1 from pg_trigger g where g.tgrelid = c.oid and g.tgname = '${TRIGGER}') loop
          execute format('create trigger ${TRIGGER} after insert or update or delete or truncate on %s for each statement execute function kiln_snapshot_note_write()', r.name);
        end loop;
      end $$;`);
    await db.listen(CHANNEL, (key) => {
      for (const image of this.images.values()) this.note(image, [key]);
    });
    this.watched = db;
  }
}

