/**
 * Store reads kept in memory for a short time. Kiln evicts entries itself when it changes the data;
 * the TTL bounds how long a change made by another instance sharing the store takes to be seen.
 */
export class TtlCache<K, V> {
  private readonly entries = new Map<K, { value: V; at: number }>();

  constructor(
    private readonly ttlMs: () => number,
    private readonly now: () => number = Date.now,
  ) {}

  get(key: K): V | undefined {
    const e = this.entries.get(key);
    if (!e) return undefined;
    if (this.now() - e.at >= this.ttlMs()) {
      this.entries.delete(key);
      return undefined;
    }
    return e.value;
  }

  set(key: K, value: V): void {
    this.entries.set(key, { value, at: this.now() });
  }

  delete(key: K): void {
    this.entries.delete(key);
  }

  deleteWhere(match: (value: V) => boolean): void {
    for (const [k, e] of this.entries) if (match(e.value)) this.entries.delete(k);
  }
}
