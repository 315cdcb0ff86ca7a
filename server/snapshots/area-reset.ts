import type { AnyArea, ResetChanges } from "../area";

/**
 * A snapshot restore under the running areas (docs/testing.md "Reset in place"): each area that has
 * a `reset` hook lets go of what changed and reads it back, instead of every area being stopped and
 * started. Which area a change belongs to: a control-store table to the area whose migrations create
 * it, a data-dir file to the area that names its top-level entry in `reset.files`.
 */
export class AreaReset {
  private readonly tableOwner = new Map<string, AnyArea>();
  private readonly fileOwner = new Map<string, AnyArea>();

  constructor(private readonly areas: readonly AnyArea[]) {
    for (const a of areas) {
      for (const m of a.migrations ?? [])
        for (const hit of m.sql.matchAll(/create\s+(?:unlogged\s+)?table\s+(?:if\s+not\s+exists\s+)?"?([A-Za-z_][A-Za-z0-9_]*)"?/gi)) {
          const table = hit[1]!.toLowerCase();
          if (!this.tableOwner.has(table)) this.tableOwner.set(table, a);
        }
      for (const f of a.reset?.files ?? []) this.fileOwner.set(f, a);
    }
  }

  private owner(kind: "table" | "file", name: string): AnyArea | undefined {
    return kind === "table" ? this.tableOwner.get(name) : this.fileOwner.get(name.split("/")[0]!);
  }

  /** The first change no hook can take (an area without one, or nobody's), or null. */
  unhooked(tables: readonly string[], files: readonly string[]): string | null {
    for (const t of tables) if (!this.owner("table", t)?.reset) return `table ${t} (${this.owner("table", t)?.name ?? "no area"})`;
    for (const f of files) if (!this.owner("file", f)?.reset) return `file ${f} (${this.owner("file", f)?.name ?? "no area"})`;
    return null;
  }

  /** What of `tables` and `files` is `area`'s. */
  private of(area: AnyArea, tables: readonly string[], files: readonly string[]): ResetChanges {
    return { tables: new Set(tables.filter((t) => this.tableOwner.get(t) === area)), files: files.filter((f) => this.owner("file", f) === area) };
  }

  /** Every hooked area writes what it holds in memory (before the changes are looked for). */
  async flush(deps: object, trace: boolean): Promise<void> {
    for (const a of this.areas) if (a.reset?.flush) await timed(trace, `flushed ${a.name}`, () => a.reset!.flush!(deps));
  }

  /**
   * Every hooked area releases what changed (reverse order), `putBack` runs, and each resumes (in
   * order) with what was put back. "restart" when `putBack` put back a table no hook takes (written after the changes
   * were looked at): the caller then stops and starts every area.
   */
  async run(deps: object, tables: string[], files: string[], putBack: () => Promise<string[]>, trace: boolean, onError: (area: AnyArea, err: unknown) => void): Promise<"in place" | "restart"> {
    let failed = false;
    const hooked = this.areas.filter((a) => a.reset);
    for (const a of [...hooked].reverse()) {
      try {
        await timed(trace, `released ${a.name}`, () => a.reset!.release?.(deps, this.of(a, tables, files)));
      } catch (err) {
        // It may still hold what is put back: the restart that follows stops it for good.
        onError(a, err);
        failed = true;
      }
    }
    let put: string[] = [];
    try {
      put = await putBack();
    } finally {
      const all = [...new Set([...tables, ...put])];
      for (const a of hooked) {
        try {
          await timed(trace, `reset ${a.name}`, () => a.reset!.resume(deps, this.of(a, all, files)));
        } catch (err) {
          // Its memory may not match its rows: a stop and start of every area reads them afresh.
          onError(a, err);
          failed = true;
        }
      }
    }
    return failed || this.unhooked(put, []) ? "restart" : "in place";
  }
}

async function timed(on: boolean, label: string, fn: () => unknown): Promise<void> {
  const t0 = performance.now();
  await fn();
  const ms = performance.now() - t0;
  if (on && ms >= 1) console.error(`snapshot:   ${label} +${Math.round(ms)} ms`);
}
