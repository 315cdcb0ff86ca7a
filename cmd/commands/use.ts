import type { Command } from "commander";
import { ApiError, type Client } from "../client";
import { CliError } from "../errors";
import { output } from "../output";
import { act, clearUsed, currentProject, readUsed, writeUsed } from "./shared";

/** A project by id, else by its exact name (names are not unique: two of a name is an error naming both). */
async function findProject(c: Client, idOrName: string): Promise<{ id: string; name: string }> {
  try {
    return await c.request("GET", `/projects/${encodeURIComponent(idOrName)}`);
  } catch (err) {
    if (!(err instanceof ApiError && (err.status === 404 || err.status === 400))) throw err;
  }
  const matches: { id: string; name: string }[] = [];
  for (let page = 1; ; page++) {
    const r = await c.request("GET", `/projects?search=${encodeURIComponent(idOrName)}&page=${page}&limit=100`);
    matches.push(...r.data.filter((p: { name: string }) => p.name === idOrName));
    if (!r.has_more) break;
  }
  if (matches.length === 1) return matches[0]!;
  if (matches.length > 1) throw new CliError(`${matches.length} projects are named '${idOrName}'`, `use one's id: ${matches.map((p) => p.id).join(", ")}`);
  throw new CliError(`no project '${idOrName}' on ${c.url}`, "kiln projects list shows the projects (kiln projects create <name> makes one)");
}

export function useCommand(program: Command): void {
  program
    .command("use [project]")
    .description("remember a project (id or name) for every command run without --project; alone, show the current one")
    .option("--clear", "forget the remembered project")
    .action(
      act(async (c, g, project: string | undefined, o: { clear?: boolean }) => {
        if (o.clear) {
          clearUsed();
          return output(g.json, { project: null }, () => console.log("No project remembered; commands need --project or KILN_PROJECT."));
        }
        if (project) {
          const p = await findProject(c, project);
          const file = writeUsed({ url: c.url, id: p.id, name: p.name });
          return output(g.json, { id: p.id, name: p.name, url: c.url, file }, () => console.log(`Using project ${p.name} (${p.id}) on ${c.url}; saved to ${file}`));
        }
        const cur = currentProject({}, c.url);
        if (!cur) {
          const used = readUsed();
          throw new CliError(
            "no current project",
            used ? `the remembered project (${used.name ?? used.id}) is for ${used.url}; run \`kiln use <project>\` for ${c.url}` : "run `kiln use <project>` (an id or a name), or set KILN_PROJECT",
          );
        }
        const used = readUsed();
        const name = cur.from.startsWith("kiln use") ? used?.name : undefined;
        output(g.json, { id: cur.id, ...(name ? { name } : {}), from: cur.from, url: c.url }, () => console.log(`${name ? `${name} (${cur.id})` : cur.id}  from ${cur.from}`));
      }),
    );
}

