import { existsSync, readFileSync, statSync } from "node:fs";
import type { Command } from "commander";
import { ApiError, Client } from "../client";
import { CliError, printError } from "../errors";
import { output, printObject, printTable } from "../output";
import { openTail, type Entry } from "./log-stream";
import { readEvents } from "../../server/logs/sse-reader";
import { act, appClient, keyOption, requireProject, PROJECT_HELP, type KeyOptions } from "./shared";

/** A folder becomes a tar.gz on the fly (installed dependency folders left out); a file is sent as is. */
export async function archiveOf(path: string): Promise<Uint8Array> {
  if (!existsSync(path)) throw new CliError(`no such local file or folder ${path}`, "give the folder holding the function's code, or a ZIP/tar.gz archive of it");
  if (!statSync(path).isDirectory()) return readFileSync(path);
  const tar = await import("tar");
  const skip = /(^|\/)(node_modules|python_deps|\.venv|vendor|\.git)(\/|$)/;
  const chunks: Buffer[] = [];
  const stream = tar.c({ gzip: true, cwd: path, portable: true, filter: (p: string) => !skip.test(p.replace(/^\.\//, "")) }, ["."]);
  for await (const c of stream as AsyncIterable<Buffer>) chunks.push(c);
  return Buffer.concat(chunks);
}

export async function findFunction(c: Client, projectId: string, nameOrId: string) {
  const list = await c.request("GET", `/projects/${encodeURIComponent(projectId)}/functions?page=1&limit=100`);
  const fn = list.data.find((f: { id: string; name: string }) => f.name === nameOrId || f.id === nameOrId);
  if (!fn) throw new ApiError(404, { error: "function not found" });
  return fn;
}

/**
 * Prints a deployment's build lines on stderr as the live tail brings them. `finish(last)` waits, up to 3 s, for the build's closing line (`last`: "build
 * succeeded" or the deployment's error), which the build writes before its status changes.
 */
export function streamBuild(c: Client, project: string, deploymentId: string, type: "function" | "frontend" = "function") {
  const ctl = new AbortController();
  const seen: string[] = [];
  let wake = () => {};
  const done = (async () => {
    const res = await openTail(c, project, { type, build: deploymentId, backlog: 1000 }, ctl.signal);
    await readEvents(res, (name, data) => {
      if (name !== "log") return;
      const e = JSON.parse(data) as Entry;
      const body = typeof e.body === "string" ? e.body : JSON.stringify(e.body);
      seen.push(body);
      process.stderr.write(`build  ${body}\n`);
      wake();
    });
  })().catch((err) => {
    if (!ctl.signal.aborted) process.stderr.write(`kiln: the build log could not be followed (${(err as Error).message})\n`);
  });
  return {
    finish: async (last: string | null) => {
      const until = Date.now() + 3000;
      while (Date.now() < until && !(last && seen.includes(last))) await new Promise<void>((r) => ((wake = r), setTimeout(r, 100)));
    },
    stop: () => {
      ctl.abort();
      void done;
    },
  };
}

export function functionsCommand(program: Command): void {
  const fns = program.command("functions").description("deploy and invoke functions");
  const base = (o: { project?: string }) => `/projects/${encodeURIComponent(requireProject(o))}/functions`;

  fns
    .command("deploy <path>")
    .description("deploy a folder or a ZIP/tar.gz archive")
    .option("--project <id>", PROJECT_HELP)
    .requiredOption("--name <name>")
    .requiredOption("--runtime <runtime>", "nodejs22.x, nodejs24.x, python3.10 … python3.14, ruby3.3 …")
    .option("--handler <name>", "exported handler name (default handler)")
    .option("--public", "allow anon keys with functions.invoke")
    .option("--http", "HTTP invocation mode (request events on the function's own address)")
    .option("--no-auth", "with --public --http: no token needed on the function's address")
    .option("--wait", "wait until the deployment finishes, printing its build log (stderr) as it is written")
    .action(
      act(async (c, g, path: string, o: { project: string; name: string; runtime: string; handler?: string; public?: boolean; http?: boolean; auth?: boolean; wait?: boolean }) => {
        const form = new FormData();
        form.set("name", o.name);
        form.set("runtime", o.runtime);
        if (o.handler) form.set("handler", o.handler);
        if (o.public) form.set("is_public", "true");
        if (o.http) form.set("invocation_mode", "http");
        if (o.auth === false) form.set("http_auth_mode", "none");
        form.set("code", new Blob([new Uint8Array(await archiveOf(path))]), "code.tar.gz");
        let fn = await c.requestForm("POST", base(o), form);
        if (o.wait) {
          // The build's lines as they are written (stderr: stdout stays the function), while the status is polled.
          const deploymentId = fn.pending_deployment_id ?? (await c.request("GET", `${base(o)}/${fn.id}/deployments`)).data.find((d: { kind: string }) => d.kind === "deploy")?.id;
          // Not under --json: stderr then carries only the one JSON error line.
          const build = deploymentId && !g.json ? streamBuild(c, requireProject(o), deploymentId) : null;
          try {
            for (let i = 0; i < 3000 && (fn.status === "provisioning" || fn.pending_deployment_id); i++) {
              await new Promise((r) => setTimeout(r, 200));
              fn = await c.request("GET", `${base(o)}/${fn.id}`);
            }
            const deps = await c.request("GET", `${base(o)}/${fn.id}/deployments`);
            const mine = deps.data.find((d: { id: string }) => d.id === deploymentId) ?? deps.data[0];
            await build?.finish(mine?.status === "failed" ? mine.error : "build succeeded");
            if (fn.status === "failed" || mine?.status === "failed") throw new Error(`deployment failed: ${mine?.error ?? "see kiln functions deployments"}`);
          } finally {
            build?.stop();
          }
        }
        output(g.json, fn, () => printObject(fn));
      }),
    );
  fns
    .command("list")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, o: { project: string }) => {
        const r = await c.request("GET", `${base(o)}?page=1&limit=100`);
        output(g.json, r, () => printTable(r.data, ["id", "name", "status", "runtime", "invocation_mode", "is_public", "updated_at"], "functions"));
      }),
    );
  fns
    .command("get <name>")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, name: string, o: { project: string }) => {
        const fn = await findFunction(c, requireProject(o), name);
        const r = await c.request("GET", `${base(o)}/${fn.id}`);
        output(g.json, r, () => printObject(r));
      }),
    );
  fns
    .command("deployments <name>")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, name: string, o: { project: string }) => {
        const fn = await findFunction(c, requireProject(o), name);
        const r = await c.request("GET", `${base(o)}/${fn.id}/deployments`);
        output(g.json, r, () => printTable(r.data, ["id", "kind", "status", "runtime", "error", "created_at", "finished_at"], "deployments"));
      }),
    );
  fns
    .command("delete <name>")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, name: string, o: { project: string }) => {
        const fn = await findFunction(c, requireProject(o), name);
        const r = await c.request("DELETE", `${base(o)}/${fn.id}`);
        output(g.json, r, () => console.log(`Deleting ${fn.name} (${r.status})`));
      }),
    );
  keyOption(
    fns
      .command("invoke <name>")
      .description("invoke by RPC with an application key: a service key, end-user token or anon key (--key or KILN_SERVICE_KEY)")
      .option("--data <json>", "the payload", "null"),
  ).action(
    act(async (c, g, name: string, o: KeyOptions & { data: string }) => {
      const app = appClient(c, o, "invoking a function");
      let payload: unknown;
      try {
        payload = JSON.parse(o.data);
      } catch {
        throw new CliError("--data must be JSON", `for example --data '{"name":"ada"}'`);
      }
      const { function_id } = await app.request("GET", `/functions/resolve?name=${encodeURIComponent(name)}`);
      const res = await app.raw("POST", `/functions/${function_id}/invoke`, { payload });
      const text = await res.text();
      if (!res.ok && (g.json || (res.status >= 500 && !text))) {
        let body: unknown = text;
        try {
          body = text ? JSON.parse(text) : undefined;
        } catch {}
        throw new ApiError(res.status, body);
      }
      // The function's answer as it came; with --json, always JSON (a text answer as a JSON string).
      if (g.json) {
        let ok = true;
        try {
          JSON.parse(text);
        } catch {
          ok = false;
        }
        return console.log(ok && text ? text : JSON.stringify(text));
      }
      process.stdout.write(text.endsWith("\n") ? text : `${text}\n`);
      if (!res.ok) process.exitCode = 1;
    }),
  );

  program
    .command("doctor")
    .description("what serves each function runtime on this machine, and how functions are isolated")
    .option("--docker-host <address>", "also check this container engine (unix:///path or tcp://host:port) for --function-runtime docker")
    .option("--runtime-path <name=path>", "as kiln start's: check this interpreter for the runtime (repeatable; KILN_RUNTIME_PATHS)", (v: string, acc: string[] = []) => [...acc, v])
    .option("--runtime-image <name=image>", "as kiln start's: the image serving the runtime under --function-runtime docker (repeatable; KILN_RUNTIME_IMAGES)", (v: string, acc: string[] = []) => [...acc, v])
    .action(async (opts: { dockerHost?: string; runtimePath?: string[]; runtimeImage?: string[] }, cmd: Command) => {
      const json = Boolean(cmd.optsWithGlobals().json);
      await (await import("../start")).applyRuntimeFlags(opts);
      const { listRuntimes } = await import("../../runtime-sandbox/runtimes");
      const { chooseIsolation, noSandboxMessage } = await import("../../runtime-sandbox/isolation");
      const rows = await listRuntimes();
      const runtimes = rows.map((r) => ({ runtime: r.name, source: r.source, served_by: r.servedBy ?? null, install: r.missing ?? null }));
      const problems: string[] = [];
      const want = (process.env.KILN_FUNCTION_SANDBOX ?? "auto") as "auto" | "bubblewrap" | "namespaces";
      const choice = chooseIsolation({ want, allowUnsandboxed: process.env.KILN_ALLOW_UNSANDBOXED_FUNCTIONS === "1" });
      const isolation = choice.isolation ? choice.isolation.description : noSandboxMessage(choice.problems);
      if (!choice.isolation) problems.push(`isolation: ${isolation}`);
      // The same detection and phrases as the worker pool's start-up line (runtime-sandbox/cgroups.ts).
      const { detectCgroups, describeLimits, CGROUP_CONTROLLERS } = await import("../../runtime-sandbox/cgroups");
      const cgroups = detectCgroups();
      const limits = describeLimits(cgroups.by, { sandboxed: choice.isolation?.kind !== "none", why: cgroups.why });
      const cgroupNotes: string[] = [];
      if (CGROUP_CONTROLLERS.some((c) => cgroups.by[c] === null)) {
        cgroupNotes.push(...cgroups.details, "for cgroup limits run Kiln as root, or in a delegated cgroup v2 subtree (e.g. systemd-run --user -p Delegate=yes kiln start)");
      } else if (cgroups.v2?.mustMove) {
        cgroupNotes.push(`Kiln will move the processes of ${cgroups.v2.base} into ${cgroups.v2.base}/kiln-main to enable the v2 controllers`);
      }
      let containers: string | null = null;
      if (opts.dockerHost || process.env.DOCKER_HOST || process.env.KILN_DOCKER_HOST) {
        const { ContainerEngine } = await import("../../runtime-sandbox/container");
        try {
          const engine = await ContainerEngine.connect({ host: opts.dockerHost ?? process.env.KILN_DOCKER_HOST, image: process.env.KILN_FUNCTION_IMAGE, importImage: false });
          containers = engine.describe();
        } catch (e) {
          containers = (e as Error).message;
          problems.push(`containers: ${containers}`);
        }
      }
      const report = { runtimes, isolation, not_used: choice.problems, limits, cgroups: cgroupNotes, containers };
      output(json, report, () => {
        printTable(runtimes.map((r) => ({ ...r, install: r.install ?? "" })), ["runtime", "source", "served_by", "install"], "runtimes");
        for (const p of choice.problems) console.log(`not used: ${p}`);
        console.log(`isolation: ${isolation}`);
        console.log(`limits: ${limits.join(", ")}`);
        for (const n of cgroupNotes) console.log(`cgroups: ${n}`);
        if (containers !== null) console.log(`containers: ${containers}`);
      });
      // A problem makes the exit status 1; with --json the report is still printed, and the problem is the error.
      if (problems.length) {
        if (json) printError(new CliError(problems.join("; ")), true);
        process.exitCode = 1;
      }
    });

  fns
    .command("base-image")
    .description("write the function containers' base image (a root filesystem tar) to stdout, for `docker import - kiln-runtime:base`")
    .action(async () => {
      if (process.stdout.isTTY) throw new Error("this writes a tar archive; pipe it, e.g. kiln functions base-image | docker import - kiln-runtime:base");
      const { baseImageTar } = await import("../../runtime-sandbox/container");
      const tar = await baseImageTar();
      await new Promise<void>((resolve, reject) => tar.pipe(process.stdout).on("finish", resolve).on("error", reject));
    });
}
