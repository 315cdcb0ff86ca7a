import type { Command } from "commander";
import { ensureControlTemplate } from "../server/store/template";

/** Maintenance commands run by npm scripts, hidden from help. */
export function internalCommand(program: Command): void {
  const internal = program.command("internal", { hidden: true });
  internal
    .command("prepare-template")
    .description("make the embedded control-store template now (npm ci runs this) so the first `kiln start` is fast")
    .action(async () => {
      const t0 = performance.now();
      const dir = await ensureControlTemplate();
      console.log(`kiln: control-store template ready at ${dir} (${Math.round(performance.now() - t0)} ms)`);
    });
}
