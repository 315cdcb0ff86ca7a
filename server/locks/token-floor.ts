import type { ControlStore } from "../store/store";
import { MemoryLockTable } from "./memory-lock-table";

/**
 * Fencing tokens the in-memory table (embedded profile) may issue beyond what the store records.
 * The store holds a ceiling no issued token is above; it is raised by this much whenever the last
 * issued token comes within half of it, in the background, so the request path never waits for it.
 */
export const TOKEN_RESERVATION = 1_000_000;

async function readCeiling(store: ControlStore): Promise<number> {
  const [row] = await store.query<{ ceiling: string }>(`select ceiling::text as ceiling from lock_token_floor where id = 1`);
  const n = row ? Number(row.ceiling) : 0;
  if (!Number.isSafeInteger(n) || n < 0) throw new Error(`lock_token_floor holds ${row?.ceiling}, not a fencing token`);
  return n;
}

async function writeCeiling(store: ControlStore, ceiling: number): Promise<void> {
  await store.query(
    `insert into lock_token_floor (id, ceiling) values (1, $1::text::bigint)
     on conflict (id) do update set ceiling = excluded.ceiling`,
    [String(ceiling)],
  );
}

/**
 * The embedded profile's lock table with its restart floor: fencing tokens never go down across
 * restarts of one data dir, kill -9 included.
 *
 * - start: the stored ceiling C is the floor (the first token is C + 1), and C + TOKEN_RESERVATION
 *   is recorded before Kiln serves;
 * - after each acquire (`issued`): once the last token passes the recorded ceiling minus half a
 *   reservation, last + TOKEN_RESERVATION is recorded (one write at a time, never awaited by the request);
 * - clean stop: the last issued token itself is recorded, so a clean restart leaves no gap.
 *
 * So the record is always at least every token issued (unless 500,000 acquisitions happen during
 * one write of one row), and a crash costs at most one reservation of unused tokens: gaps, which the
 * spec allows.
 */
export class FencedMemoryTable {
  private recorded: number;
  private writing: Promise<void> | null = null;

  private constructor(
    readonly table: MemoryLockTable,
    private readonly store: ControlStore,
    recorded: number,
    private readonly onError: (err: unknown) => void,
    private readonly reservation: number,
  ) {
    this.recorded = recorded;
  }

  /** `reservation`: TOKEN_RESERVATION, smaller in tests. */
  static async open(store: ControlStore, onError: (err: unknown) => void, reservation = TOKEN_RESERVATION): Promise<FencedMemoryTable> {
    const floor = await readCeiling(store);
    const reserved = floor + reservation;
    await writeCeiling(store, reserved);
    return new FencedMemoryTable(new MemoryLockTable({ tokenFloor: floor }), store, reserved, onError, reservation);
  }

  /** The ceiling in the store (what a restart starts above). */
  get recordedCeiling(): number {
    return this.recorded;
  }

  /** Call after every acquire: reserves the next tokens when the last reservation is half used. */
  issued(): void {
    const last = this.table.lastFencingToken;
    if (this.writing || last <= this.recorded - this.reservation / 2) return;
    const next = last + this.reservation;
    this.writing = writeCeiling(this.store, next)
      .then(() => void (this.recorded = Math.max(this.recorded, next)))
      .catch(this.onError)
      .finally(() => (this.writing = null));
  }

  /** Resolves when no reservation write is under way (tests). */
  async settled(): Promise<void> {
    await this.writing;
  }

  /** Kiln is stopping (no request is in flight): records the last token issued, then closes the table. */
  async close(): Promise<void> {
    try {
      await this.writing;
      await writeCeiling(this.store, this.table.lastFencingToken);
      this.recorded = this.table.lastFencingToken;
    } finally {
      await this.table.close();
    }
  }
}
