import type { ControlStore } from "../store/store";

/**
 * The fencing-token floor of an older Kiln (embedded profile): one counter for every project, its
 * ceiling kept in the control store (`lock_token_floor`). Leases and per-project counters now live
 * in the lease journal; this ceiling, no longer written, is where every project's tokens start
 * (above), so a data dir made by an older Kiln never sees a token go down.
 */
export async function legacyTokenCeiling(store: ControlStore): Promise<number> {
  const [row] = await store.query<{ ceiling: string }>(`select ceiling::text as ceiling from lock_token_floor where id = 1`);
  const n = row ? Number(row.ceiling) : 0;
  if (!Number.isSafeInteger(n) || n < 0) throw new Error(`lock_token_floor holds ${row?.ceiling}, not a fencing token`);
  return n;
}
