import type { ControlStore, Sql } from "../store/store";
import type { SecretKey } from "./secret-key";

/**
 * A control-store column that holds secrets, declared by the area that owns the table
 * (`Area.secrets`): the area writes it encrypted with the instance secret key and decrypts what it
 * reads; at start Kiln encrypts rows written before the column was declared, and re-encrypts rows a
 * previous key wrote (rotation).
 */
export interface SecretColumn {
  table: string;
  /** The table's primary key column (text). */
  key: string;
  column: string;
  /** A jsonb column: the ciphertext is stored as a JSON string, the plaintext is the JSON text. */
  json?: boolean;
}

const CHECK_PLAINTEXT = "kiln secret key check";
/** Serialises the check and the passes among Kiln instances sharing a PostgreSQL store. */
const LOCK_ID = 7420002;
const BATCH = 500;

export interface SecureReport {
  /** Rows found in plaintext and encrypted by this start. */
  encrypted: number;
  /** Rows a previous key wrote, re-encrypted with the current one. */
  reencrypted: number;
  /** The store had no key check yet (first start, or the first start of a Kiln that encrypts). */
  firstCheck: boolean;
}

export function anotherKeyMessage(storeKeyId: string | null, key: SecretKey): string {
  return (
    `this data was written with another KILN_SECRET_KEY (key id ${storeKeyId ?? "unknown"}; this Kiln's key is ${key.id}); ` +
    `start Kiln with the key the control store was written with (KILN_SECRET_KEY, KILN_SECRET_KEY_FILE, or the data dir's secret.key), ` +
    `or, to change keys, give the old key as KILN_SECRET_KEY_PREVIOUS and the new one as KILN_SECRET_KEY`
  );
}

/**
 * At start, before any area reads the store: checks that the store was written with this key (else
 * refuses, naming the fix), encrypts declared columns' rows still in plaintext, and re-encrypts rows
 * written with a previous key. One transaction under an advisory lock: several instances starting
 * together run it once, and a failure leaves the store as it was.
 */
export async function secureStoredSecrets(store: ControlStore, key: SecretKey, columns: readonly SecretColumn[]): Promise<SecureReport> {
  // Every start but the first after a change: one read, no transaction, no lock.
  const settled = await store
    .query<{ check_value: string; encrypted_columns: string[] }>(`select check_value, encrypted_columns from kiln_secret_key_check where id = 1`)
    .then(([r]) => r);
  if (settled && !key.previousIds.length && key.keyIdOf(settled.check_value) === key.id && columns.every((c) => settled.encrypted_columns.includes(`${c.table}.${c.column}`))) {
    let ok = false;
    try {
      ok = key.decrypt(settled.check_value) === CHECK_PLAINTEXT;
    } catch {}
    if (!ok) throw new Error(anotherKeyMessage(key.id, key));
    return { encrypted: 0, reencrypted: 0, firstCheck: false };
  }
  return store.transaction(async (tx) => {
    await tx.query(`select pg_advisory_xact_lock(${LOCK_ID})`);
    const [row] = await tx.query<{ check_value: string; encrypted_columns: string[] }>(`select check_value, encrypted_columns from kiln_secret_key_check where id = 1`);
    if (row) {
      const storeKeyId = key.keyIdOf(row.check_value);
      let ok = false;
      try {
        ok = key.decrypt(row.check_value) === CHECK_PLAINTEXT;
      } catch {}
      if (!ok) throw new Error(anotherKeyMessage(storeKeyId, key));
    }
    const done = new Set(row?.encrypted_columns ?? []);
    const report: SecureReport = { encrypted: 0, reencrypted: 0, firstCheck: !row };
    for (const c of columns) {
      const name = `${c.table}.${c.column}`;
      if (!done.has(name)) {
        // Written before the column was declared secret: plaintext (or, after an interrupted
        // upgrade of another instance, already a ciphertext of a key this Kiln knows).
        await rewrite(tx, c, null, (v) => {
          if (isOurs(key, v)) {
            if (key.keyIdOf(v) === key.id) return null;
            report.reencrypted++;
            return key.encrypt(key.decrypt(v));
          }
          report.encrypted++;
          return key.encrypt(v);
        });
      } else {
        for (const old of key.previousIds) {
          await rewrite(tx, c, `kiln:v1:${old}:%`, (v) => {
            report.reencrypted++;
            return key.encrypt(key.decrypt(v));
          });
        }
      }
    }
    const names = columns.map((c) => `${c.table}.${c.column}`);
    const checkValue = row && key.keyIdOf(row.check_value) === key.id ? row.check_value : key.encrypt(CHECK_PLAINTEXT);
    const unchanged = row && checkValue === row.check_value && names.every((n) => done.has(n));
    if (!unchanged) {
      await tx.query(
        `insert into kiln_secret_key_check (id, check_value, encrypted_columns, updated_at) values (1, $1, $2::text::jsonb, now())
         on conflict (id) do update set check_value = excluded.check_value, encrypted_columns = excluded.encrypted_columns, updated_at = excluded.updated_at`,
        [checkValue, JSON.stringify([...new Set([...done, ...names])])],
      );
    }
    return report;
  });
}

/** A ciphertext this key (or a previous one) wrote and can read. */
function isOurs(key: SecretKey, v: string): boolean {
  const id = key.keyIdOf(v);
  if (!id || !key.knows(id)) return false;
  try {
    key.decrypt(v);
    return true;
  } catch {
    return false;
  }
}

/**
 * Rewrites a column in key order, BATCH rows at a time (`like`: only values with that prefix); `map`
 * returns the new value, or null to leave the row alone. One update statement per batch.
 */
async function rewrite(tx: Sql, c: SecretColumn, like: string | null, map: (value: string) => string | null): Promise<void> {
  const value = c.json ? `${c.column} #>> '{}'` : c.column;
  let after: string | null = null;
  for (;;) {
    const params: unknown[] = [];
    const where: string[] = [`${c.column} is not null`];
    if (like) where.push(`${value} like $${params.push(like)}`);
    if (after !== null) where.push(`${c.key} > $${params.push(after)}`);
    const rows = await tx.query<{ k: string; v: string }>(
      `select ${c.key} as k, ${c.json ? `case when jsonb_typeof(${c.column}) = 'string' then ${c.column} #>> '{}' else ${c.column}::text end` : c.column} as v
         from ${c.table} where ${where.join(" and ")} order by ${c.key} limit ${BATCH}`,
      params,
    );
    if (!rows.length) return;
    after = rows[rows.length - 1]!.k;
    const changed: { k: string; v: string }[] = [];
    for (const r of rows) {
      const next = map(r.v);
      if (next !== null) changed.push({ k: r.k, v: next });
    }
    if (changed.length) {
      await tx.query(
        `update ${c.table} set ${c.column} = ${c.json ? "to_jsonb(n.v)" : "n.v"}
           from jsonb_to_recordset($1::text::jsonb) as n(k text, v text) where ${c.table}.${c.key} = n.k`,
        [JSON.stringify(changed)],
      );
    }
    if (rows.length < BATCH) return;
  }
}
