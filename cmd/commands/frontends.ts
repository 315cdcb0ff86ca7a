import { existsSync, readFileSync, statSync } from "node:fs";
import type { Command } from "commander";
import { ApiError, type Client } from "../client";
import { CliError } from "../errors";
import { output, printObject, printTable } from "../output";
import { streamBuild } from "./functions";
import { act, requireProject, PROJECT_HELP } from "./shared";

/** A folder becomes a tar.gz on the fly (node_modules, .git and .next left out: the build makes them); a file is sent as is. */
async function siteArchive(path: string): Promise<Uint8Array> {
  if (!existsSync(path)) throw new CliError(`no such local file or folder ${path}`, "give the folder holding the site or app, or a ZIP/tar.gz archive of it");
  if (!statSync(path).isDirectory()) return readFileSync(path);
  const tar = await import("tar");
  const skip = /(^|\/)(node_modules|\.git|\.next)(\/|$)/;
  const chunks: Buffer[] = [];
  const stream = tar.c({ gzip: true, cwd: path, portable: true, filter: (p: string) => !skip.test(p.replace(/^\.\//, "")) }, ["."]);
  for await (const c of stream as AsyncIterable<Buffer>) chunks.push(c);
  return Buffer.concat(chunks);
}

const base = (o: { project?: string }) => `/projects/${encodeURIComponent(requireProject(o))}/frontends`;

async function findFrontend(c: Client, o: { project?: string }, nameOrId: string) {
  try {
    return await c.request("GET", `${base(o)}/${encodeURIComponent(nameOrId)}`);
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) throw new ApiError(404, { error: `frontend ${nameOrId} not found` });
    throw err;
  }
}

/** Polls until no deployment of the frontend runs or waits, printing the build log of `deploymentId` as it is written (stderr). */
async function follow(c: Client, g: { json?: boolean }, o: { project?: string }, fe: any, deploymentId: string | undefined) {
  const build = deploymentId && !g.json ? streamBuild(c, requireProject(o), deploymentId, "frontend") : null;
  try {
    for (let i = 0; i < 6000 && (fe.status === "provisioning" || fe.status === "deleting" || fe.pending_deployment_id); i++) {
      await new Promise((r) => setTimeout(r, 200));
      fe = await c.request("GET", `${base(o)}/${fe.id}`);
    }
    const deps = await c.request("GET", `${base(o)}/${fe.id}/deployments`);
    const mine = deps.data.find((d: { id: string }) => d.id === deploymentId) ?? deps.data[0];
    await build?.finish(mine?.status === "failed" ? mine.error : "build succeeded");
    if (mine?.status === "failed") throw new Error(`deployment failed: ${mine.error}`);
    return fe;
  } finally {
    build?.stop();
  }
}

export function frontendsCommand(program: Command): void {
  const fe = program.command("frontends").description("deploy static sites and Next.js apps");

  fe.command("deploy <path>")
    .description("deploy a folder or a ZIP/tar.gz archive, streaming its build (create, or update the frontend of that name)")
    .option("--project <id>", PROJECT_HELP)
    .requiredOption("--name <name>", "DNS-safe: lowercase letters, digits, hyphens (at most 41)")
    .option("--framework <name>", "nextjs (detected from package.json when omitted; otherwise a static site)")
    .option("--app-root <path>", "the app's folder inside the archive (monorepos)")
    .option("--variable-scope <scope>", "scoped (only --variable names; the default for new frontends) or all")
    .option("--variable <name...>", "a project variable the build and server see (repeatable)")
    .option("--no-wait", "return once the deployment is accepted")
    .action(
      act(async (c, g, path: string, o: { project: string; name: string; framework?: string; appRoot?: string; variableScope?: string; variable?: string[]; wait: boolean }) => {
        const form = new FormData();
        form.set("name", o.name);
        if (o.framework) form.set("framework", o.framework);
        if (o.appRoot) form.set("app_root", o.appRoot);
        if (o.variableScope) form.set("variable_scope", o.variableScope);
        for (const v of o.variable ?? []) form.append("variables", v);
        form.set("archive", new Blob([new Uint8Array(await siteArchive(path))]), "site.tar.gz");
        let f = await c.requestForm("POST", base(o), form);
        if (o.wait) f = await follow(c, g, o, f, f.pending_deployment_id ?? f.current_deployment_id ?? undefined);
        output(g.json, f, () => printObject(f));
      }),
    );
  fe.command("list")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, o: { project: string }) => {
        const r = await c.request("GET", `${base(o)}?page=1&limit=100`);
        output(g.json, r, () => printTable(r.data, ["id", "name", "status", "framework", "site_url", "custom_domain", "updated_at"], "frontends"));
      }),
    );
  fe.command("get <name>")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, name: string, o: { project: string }) => {
        const r = await findFrontend(c, o, name);
        output(g.json, r, () => printObject(r));
      }),
    );
  fe.command("redeploy <name>")
    .description("build the latest archive again (stored app_root), streaming the build")
    .option("--project <id>", PROJECT_HELP)
    .option("--no-wait", "return once the deployment is accepted")
    .action(
      act(async (c, g, name: string, o: { project: string; wait: boolean }) => {
        const f0 = await findFrontend(c, o, name);
        let f = await c.request("POST", `${base(o)}/${f0.id}/redeploy`);
        if (o.wait) f = await follow(c, g, o, f, f.pending_deployment_id ?? f.current_deployment_id ?? undefined);
        output(g.json, f, () => printObject(f));
      }),
    );
  fe.command("deployments <name>")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, name: string, o: { project: string }) => {
        const f = await findFrontend(c, o, name);
        const r = await c.request("GET", `${base(o)}/${f.id}/deployments?page=1&limit=100`);
        output(g.json, r, () => printTable(r.data, ["id", "kind", "status", "framework", "error", "created_at", "finished_at"], "deployments"));
      }),
    );
  fe.command("delete <name>")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, name: string, o: { project: string }) => {
        const f = await findFrontend(c, o, name);
        const r = await c.request("DELETE", `${base(o)}/${f.id}`);
        output(g.json, r, () => console.log(`Deleting ${f.name}${r.pending_deployment_id ? " (after the running deployment)" : ""}`));
      }),
    );

  const domain = fe.command("domain").description("a frontend's custom domain, served with your certificate (SUPERAGENT)");
  domain
    .command("set <name> <domain>")
    .option("--project <id>", PROJECT_HELP)
    .requiredOption("--cert <file>", "the certificate (PEM)")
    .requiredOption("--key <file>", "its private key (PEM)")
    .option("--chain <file>", "intermediate certificates (PEM)")
    .action(
      act(async (c, g, name: string, host: string, o: { project: string; cert: string; key: string; chain?: string }) => {
        const read = (p: string) => {
          if (!existsSync(p)) throw new CliError(`no such file ${p}`);
          return readFileSync(p, "utf8");
        };
        const f = await findFrontend(c, o, name);
        const body = { domain: host, tls: { mode: "byoc", certificate_pem: read(o.cert), private_key_pem: read(o.key), ...(o.chain ? { certificate_chain_pem: read(o.chain) } : {}) } };
        const r = await c.request("POST", `${base(o)}/${f.id}/domain`, body);
        output(g.json, r, () => printObject(r));
      }),
    );
  domain
    .command("get <name>")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, name: string, o: { project: string }) => {
        const f = await findFrontend(c, o, name);
        const r = await c.request("GET", `${base(o)}/${f.id}/domain`);
        output(g.json, r, () => (r === null ? console.log(`${f.name} has no custom domain`) : printObject(r)));
      }),
    );
  domain
    .command("delete <name>")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, name: string, o: { project: string }) => {
        const f = await findFrontend(c, o, name);
        await c.request("DELETE", `${base(o)}/${f.id}/domain`);
        output(g.json, { detaching: true }, () => console.log(`Detaching the custom domain of ${f.name}`));
      }),
    );
}
