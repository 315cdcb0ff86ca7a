// No import cycles among Kiln's own modules, type-only imports included: an area depends on the
// platform and on the areas before it (server/areas.ts), never the other way round. madge does this
// check, but its TypeScript parser needs TypeScript 5's compiler API, which TypeScript 7 (ours) has
// not; this reads the import specifiers, which is all the check needs.
import { readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { describe, expect, test } from "vitest";

const ROOT = resolve(import.meta.dirname, "../..");
const DIRS = ["server", "cmd", "runtime-sandbox", "emulators"];

function sources(dir: string): string[] {
  const out: string[] = [];
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) out.push(...sources(p));
    else if (/\.(ts|mts)$/.test(name) && !name.endsWith(".d.ts") && !name.endsWith(".test.ts")) out.push(p);
  }
  return out;
}

/** Relative specifiers of static imports and re-exports (value and type) and of `import("...")`. */
export function specifiersOf(code: string): string[] {
  const text = code.replace(/\/\*[\s\S]*?\*\//g, "").replace(/^\s*\/\/.*$/gm, "");
  const out: string[] = [];
  for (const m of text.matchAll(/(?:^|[;\n])\s*(?:import|export)\s[^;]*?\sfrom\s*["']([^"']+)["']/g)) out.push(m[1]!);
  for (const m of text.matchAll(/\bimport\s*\(\s*["']([^"']+)["']\s*\)/g)) out.push(m[1]!);
  return out.filter((s) => s.startsWith("."));
}

function resolveSpecifier(from: string, spec: string, files: Set<string>): string | null {
  const base = resolve(dirname(from), spec);
  for (const c of [base, `${base}.ts`, join(base, "index.ts")]) if (files.has(c)) return c;
  return null;
}

/** Every cycle's files (strongly connected components of more than one file, or a self-import). */
export function cyclesOf(graph: Map<string, string[]>): string[][] {
  let index = 0;
  const idx = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const on = new Set<string>();
  const out: string[][] = [];
  const visit = (v: string) => {
    idx.set(v, index);
    low.set(v, index++);
    stack.push(v);
    on.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!idx.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (on.has(w)) low.set(v, Math.min(low.get(v)!, idx.get(w)!));
    }
    if (low.get(v) === idx.get(v)) {
      const scc: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        on.delete(w);
        scc.push(w);
      } while (w !== v);
      if (scc.length > 1 || (graph.get(v) ?? []).includes(v)) out.push(scc.sort());
    }
  };
  for (const v of graph.keys()) if (!idx.has(v)) visit(v);
  return out;
}

describe("module graph", () => {
  test("the specifier reader sees type imports, re-exports and dynamic imports, not comments", () => {
    const code = `import type { A } from "./a";\nimport { b } from '../b';\nexport { c } from "./c";\nexport type { D } from "./d";\n// import { x } from "./x";\nconst e = await import("./e");\nimport * as z from "zod";\nimport {\n  f,\n  g,\n} from "./fg";`;
    expect(specifiersOf(code).sort()).toEqual(["../b", "./a", "./c", "./d", "./e", "./fg"]);
  });
  test("the cycle finder finds a cycle and only cycles", () => {
    expect(cyclesOf(new Map([["a", ["b"]], ["b", ["c"]], ["c", ["a"]], ["d", ["a"]]]))).toEqual([["a", "b", "c"]]);
    expect(cyclesOf(new Map([["a", ["b"]], ["b", []]]))).toEqual([]);
  });
  test("no import cycles among Kiln's modules (type-only imports included)", () => {
    const files = new Set(DIRS.flatMap((d) => sources(join(ROOT, d))));
    const graph = new Map<string, string[]>();
    for (const f of files) graph.set(f, specifiersOf(readFileSync(f, "utf8")).flatMap((s) => resolveSpecifier(f, s, files) ?? []));
    const cycles = cyclesOf(graph).map((c) => c.map((f) => relative(ROOT, f)));
    expect(cycles).toEqual([]);
  });
});
