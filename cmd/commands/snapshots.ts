import type { Command } from "commander";
import { output, printObject, printTable } from "../output";
import { act } from "./shared";

const one = (name: string) => `/_kiln/snapshots/${encodeURIComponent(name)}`;

/** `kiln snapshot save|restore|list|delete` and `kiln reset` (embedded profile; docs/testing.md). */
export function snapshotCommand(program: Command): void {
  const cmd = program.command("snapshot").description("snapshots of the whole platform: every project, database, object, log line, lock and the clock (embedded profile)");
  cmd
    .command("save <name>")
    .description("take a snapshot (1-63 letters, digits, '.', '_' or '-')")
    .action(
      act(async (c, g, name: string) => {
        const r = await c.request("POST", "/_kiln/snapshots", { name });
        output(g.json, r, () => printObject(r));
      }),
    );
  cmd
    .command("restore <name>")
    .description("put the whole platform back to a snapshot; returns once everything is back")
    .action(
      act(async (c, g, name: string) => {
        const r = await c.request("POST", `${one(name)}/restore`);
        output(g.json, r, () => printObject(r));
      }),
    );
  cmd
    .command("list")
    .description("list snapshots, oldest first")
    .action(
      act(async (c, g) => {
        const r = await c.request<{ data: Record<string, unknown>[] }>("GET", "/_kiln/snapshots");
        output(g.json, r, () => printTable(r.data, ["name", "created_at", "size_bytes"], "snapshots"));
      }),
    );
  cmd
    .command("delete <name>")
    .description("delete a snapshot")
    .action(
      act(async (c, g, name: string) => {
        await c.request("DELETE", one(name));
        output(g.json, { deleted: name }, () => console.log(`deleted snapshot ${name}`));
      }),
    );
  program
    .command("reset")
    .description("put the whole platform back to the state right after start (kiln start --resettable)")
    .action(
      act(async (c, g) => {
        const r = await c.request("POST", "/_kiln/reset");
        output(g.json, r, () => printObject(r));
      }),
    );
}
