import type { Command } from "commander";

/** Maintenance commands run by npm scripts, hidden from help. */
export function internalCommand(program: Command): void {
  const internal = program.command("internal", { hidden: true });
  internal
    .command("prepare-template")
    .description("make the embedded templates (control store, databases) now (npm ci runs this) so the first `kiln start` is fast")
    .option("--archives <dir>", "also write each template as a .tar.gz into <dir> (cmd/build-binary.ts embeds them)")
    .action(async (opts: { archives?: string }) => {
      const t0 = performance.now();
      // Loaded here, not at the top: the server's modules would cost every other CLI command ~0.3 s.
      const { SCHEMA } = await import("../server/areas");
      const { controlTemplate, ensureTemplate, writeTemplateArchive } = await import("../server/store/template");
      const { DATABASE_TEMPLATE } = await import("../server/backends/databases/embedded");
      for (const spec of [controlTemplate(SCHEMA), DATABASE_TEMPLATE]) {
        const dir = await ensureTemplate(spec);
        console.log(`kiln: ${spec.kind} template ready at ${dir} (${Math.round(performance.now() - t0)} ms)`);
        if (opts.archives) console.log(`kiln: ${spec.kind} template archived as ${await writeTemplateArchive(spec, opts.archives)}`);
      }
      const { extensionFiles } = await import("../server/backends/databases/extensions");
      console.log(`kiln: database extensions ready at ${(await extensionFiles()).dir} (${Math.round(performance.now() - t0)} ms)`);
    });
}
