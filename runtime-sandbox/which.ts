import { delimiter, join } from "node:path";
import { isExecutable } from "./runtime-roots";

// PATH lookups, apart from runtimes.ts: isolation.ts finds bwrap and unshare with them, and
// runtimes.ts loads isolation.ts, so a `which` in runtimes.ts closed an import cycle.

/** The folders of PATH, in order. */
export function pathDirs(): string[] {
  return (process.env.PATH ?? "").split(delimiter).filter(Boolean);
}

/** The first executable `name` on PATH, or null. */
export function which(name: string): string | null {
  for (const dir of pathDirs()) if (isExecutable(join(dir, name))) return join(dir, name);
  return null;
}
