import type { Command } from "commander";
import { output, printTable } from "../output";

/**
 * `kiln runtimes install|list|prune`: the interpreters Kiln provisions itself under
 * `<cache>/runtimes` (runtime-sandbox/runtime-roots.ts, Node from npm). Local: no server involved.
 */
export function runtimesCommand(program: Command): void {
  const rt = program.command("runtimes").description("function runtimes Kiln provisions on this machine (root filesystems from Debian, Node from npm)");

  rt.command("install")
    .description("install runtimes now (all that have a source when none is named), so the first deploy does not wait")
    .argument("[names...]", "runtime names, e.g. python3.13 ruby3.4 nodejs24.x")
    .action(async (names: string[], _o: unknown, cmd: Command) => {
      const json = Boolean(cmd.optsWithGlobals().json);
      const { RUNTIME_NAMES, prepareNodeRuntimes, prepareRuntimeRoots, isMissing } = await import("../../runtime-sandbox/runtimes");
      const { ROOT_RECIPES, NO_SOURCE, howToProvide } = await import("../../runtime-sandbox/runtime-roots");
      const wanted = names.length ? names : RUNTIME_NAMES.filter((n) => ROOT_RECIPES[n] || n.startsWith("nodejs"));
      const unknown = wanted.filter((n) => !RUNTIME_NAMES.includes(n));
      if (unknown.length) throw new Error(`unknown runtime ${unknown.join(", ")} (known: ${RUNTIME_NAMES.join(", ")})`);
      const results: Array<{ runtime: string; status: string; version: string | null; size_bytes: number | null; detail: string }> = [];
      for (const n of wanted.filter((x) => !ROOT_RECIPES[x] && !x.startsWith("nodejs"))) {
        results.push({ runtime: n, status: "no source", version: null, size_bytes: null, detail: `${NO_SOURCE[n]}: ${howToProvide(n)}` });
      }
      // One progress line per runtime, rewritten in place on a terminal.
      const shown = new Map<string, string>();
      const tty = !json && process.stderr.isTTY;
      const progress = (name: string, p: { phase: string; bytes: number }) => {
        const line = `${name}: ${p.phase} ${(p.bytes / 1e6).toFixed(1)} MB`;
        if (shown.get(name) === line) return;
        const phaseChanged = shown.get(name)?.split(" ").slice(0, -2).join(" ") !== line.split(" ").slice(0, -2).join(" ");
        shown.set(name, line);
        if (json) return;
        if (tty) process.stderr.write(`\r\x1b[K${line}`);
        else if (phaseChanged) process.stderr.write(`${line}\n`);
      };
      const roots = wanted.filter((n) => ROOT_RECIPES[n]);
      const [rootResults, nodeResults] = await Promise.all([
        roots.length ? prepareRuntimeRoots(roots, progress) : Promise.resolve([]),
        wanted.some((n) => n.startsWith("nodejs")) ? prepareNodeRuntimes() : Promise.resolve([]),
      ]);
      if (tty) process.stderr.write("\r\x1b[K");
      for (const { name, result } of rootResults) {
        if (isMissing(result)) results.push({ runtime: name, status: "failed", version: null, size_bytes: null, detail: result.missing });
        else results.push({ runtime: name, status: "installed", version: result.version, size_bytes: result.bytes, detail: `Debian ${result.suite} root ${result.dir}` });
      }
      for (const { name, result } of nodeResults) {
        if (!wanted.includes(name)) continue;
        if (isMissing(result)) results.push({ runtime: name, status: "failed", version: null, size_bytes: null, detail: result.missing });
        else results.push({ runtime: name, status: "installed", version: result.version, size_bytes: null, detail: result.command });
      }
      output(json, results, () => printTable(results.map((r) => ({ ...r, size: r.size_bytes === null ? "" : `${(r.size_bytes / 1e6).toFixed(0)} MB` })), ["runtime", "status", "version", "size", "detail"], "runtimes"));
      if (results.some((r) => r.status === "failed")) process.exitCode = 1;
    });

  rt.command("list")
    .description("what is in the runtime cache, and its size")
    .action(async (_o: unknown, cmd: Command) => {
      const json = Boolean(cmd.optsWithGlobals().json);
      const { cacheDir } = await import("../../runtime-sandbox/runtimes");
      const { listCache } = await import("../../runtime-sandbox/runtime-roots");
      const rows = listCache(cacheDir()).map((e) => ({ runtime: e.name, version: e.version, size_bytes: e.bytes, current: e.current, folder: e.entry }));
      output(json, rows, () => {
        printTable(rows.map((r) => ({ ...r, size: `${(r.size_bytes / 1e6).toFixed(0)} MB`, current: r.current ? "yes" : "no (kiln runtimes prune removes it)" })), ["runtime", "version", "size", "current", "folder"], "runtimes");
        console.log(`total ${(rows.reduce((a, r) => a + r.size_bytes, 0) / 1e6).toFixed(0)} MB in ${cacheDir()}/runtimes`);
      });
    });

  rt.command("prune")
    .description(
      "remove what no current runtime uses (roots of an older recipe, unfinished installs) and the container images Kiln imported from roots that are gone; --all removes everything",
    )
    .option("--all", "remove every installed runtime too (they are installed again on first use)")
    .option("--docker-host <address>", "the container engine whose kiln-runtime:<root> images to prune (default: KILN_DOCKER_HOST, DOCKER_HOST, then the usual sockets)")
    .action(async (o: { all?: boolean; dockerHost?: string }, cmd: Command) => {
      const json = Boolean(cmd.optsWithGlobals().json);
      const { cacheDir } = await import("../../runtime-sandbox/runtimes");
      const { listCache, pruneCache } = await import("../../runtime-sandbox/runtime-roots");
      const removed = pruneCache(cacheDir(), !!o.all).map((r) => ({ folder: r.entry, size_bytes: r.bytes }));
      // The engine's images of roots no longer in the cache (`docker import`ed by the container
      // runtime). No engine here is fine unless one was named.
      const { reachEngine, pruneRootImages } = await import("../../runtime-sandbox/container");
      const named = o.dockerHost ?? process.env.KILN_DOCKER_HOST;
      const engine = await reachEngine(named);
      let images: { removed: string[]; kept: Array<{ image: string; reason: string }>; engine: string | null; note?: string };
      if ("error" in engine) {
        if (named) throw new Error(engine.error);
        images = { removed: [], kept: [], engine: null, note: "no container engine answered: no images checked" };
      } else {
        const folders = new Set(listCache(cacheDir()).map((e) => e.entry));
        images = { ...(await pruneRootImages(engine.docker, (f) => folders.has(f))), engine: engine.address };
      }
      output(json, { removed, images }, () => {
        console.log(`removed ${removed.length} folder(s), ${(removed.reduce((a, r) => a + r.size_bytes, 0) / 1e6).toFixed(0)} MB${removed.length ? `: ${removed.map((r) => r.folder).join(", ")}` : ""}`);
        if (images.engine) console.log(`removed ${images.removed.length} image(s) from ${images.engine}${images.removed.length ? `: ${images.removed.join(", ")}` : ""}`);
        else console.log(images.note);
        for (const k of images.kept) console.log(`kept ${k.image}: ${k.reason}`);
      });
    });
}
