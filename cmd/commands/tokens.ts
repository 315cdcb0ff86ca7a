import type { Command } from "commander";
import { output, printObject, printTable } from "../output";
import { act, qs, requireProject, PROJECT_HELP } from "./shared";

const COLUMNS = ["id", "name", "scope", "status", "token_prefix", "expires_at", "last_used_at", "all_time_requests"];

export function tokensCommand(program: Command): void {
  const tokens = program.command("tokens").description("manage project access tokens (platform token required)");
  const base = (o: { project?: string }) => `/projects/${encodeURIComponent(requireProject(o))}/access-tokens`;
  tokens
    .command("create")
    .option("--project <id>", PROJECT_HELP)
    .requiredOption("--name <name>")
    .option("--scope <scope>", "full or read_only", "full")
    .option("--expires-at <time>", "RFC 3339 expiry")
    .action(
      act(async (c, g, o: { project: string; name: string; scope: string; expiresAt?: string }) => {
        const r = await c.request("POST", base(o), { name: o.name, scope: o.scope, ...(o.expiresAt ? { expires_at: o.expiresAt } : {}) });
        output(g.json, r, () => {
          printObject(r);
          console.error("Store the token now: it is not shown again.");
        });
      }),
    );
  tokens
    .command("list")
    .option("--project <id>", PROJECT_HELP)
    .option("--search <text>")
    .option("--include-revoked")
    .option("--page <n>")
    .option("--limit <n>")
    .action(
      act(async (c, g, o: { project: string; search?: string; includeRevoked?: boolean; page?: string; limit?: string }) => {
        const r = await c.request("GET", base(o) + qs({ search: o.search, include_revoked: o.includeRevoked, page: o.page, limit: o.limit }));
        output(g.json, r, () => printTable(r.data, COLUMNS, "access tokens"));
      }),
    );
  tokens
    .command("get <tokenId>")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, id: string, o: { project: string }) => {
        const r = await c.request("GET", `${base(o)}/${encodeURIComponent(id)}`);
        output(g.json, r, () => printObject(r));
      }),
    );
  tokens
    .command("revoke <tokenId>")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, id: string, o: { project: string }) => {
        await c.request("DELETE", `${base(o)}/${encodeURIComponent(id)}`);
        output(g.json, { revoked: id }, () => console.log(`Revoked ${id}`));
      }),
    );
  tokens
    .command("usage [tokenId]")
    .description("daily request counts of one token, or of every token")
    .option("--project <id>", PROJECT_HELP)
    .option("--days <n>", "how many days", "7")
    .action(
      act(async (c, g, id: string | undefined, o: { project: string; days: string }) => {
        const path = id ? `${base(o)}/${encodeURIComponent(id)}/usage` : `${base(o)}/usage`;
        const r = await c.request("GET", path + qs({ days: o.days }));
        const all = id ? [r] : r.data;
        output(g.json, r, () => {
          const days: string[] = all[0]?.daily.map((d: { day: string }) => d.day) ?? [];
          printTable(
            all.map((u: any) => ({ name: u.name, ...Object.fromEntries(u.daily.map((d: any) => [d.day, d.requests])), total: u.total_requests })),
            ["name", ...days, "total"],
            "access tokens",
          );
        });
      }),
    );
}
