import { disposeFrontendCgroups, NextjsServer } from "./nextjs/server";
import type { ContainerEngine } from "../container";
import type { FrameworkContext, FrontendBuildInput, FrontendFramework, FrontendServeInput, FrontendServer } from "./types";

/**
 * Next.js behind the frontends area's framework interface (types.ts): the build in the build
 * sandbox (nextjs/build.ts) and the standalone server as a warm sandboxed Node.js process
 * (nextjs/server.ts). Loaded by the area on first use.
 */
export function createNextjsFramework(ctx: FrameworkContext): FrontendFramework {
  const servers = new Set<FrontendServer>();
  // --function-runtime docker: servers run as containers on the engine, connected at the first start.
  let engine: Promise<ContainerEngine> | null = null;
  const containers = ctx.containers
    ? () =>
        (engine ??= import("../container").then((m) => m.ContainerEngine.connect({ host: ctx.containers!.host, image: ctx.containers!.image, hiddenPaths: ctx.hiddenPaths })).catch((e) => {
          engine = null;
          throw e;
        }))
    : null;
  return {
    kind: "nextjs",
    async detect(appDir: string) {
      const { isNextjsApp } = await import("./nextjs/build");
      return isNextjsApp(appDir);
    },
    async build(input: FrontendBuildInput) {
      const { buildNextjs } = await import("./nextjs/build");
      return buildNextjs({ hiddenPaths: ctx.hiddenPaths, sandbox: ctx.sandbox }, input);
    },
    serve(input: FrontendServeInput) {
      const server = new NextjsServer({ hiddenPaths: ctx.hiddenPaths, sandbox: ctx.sandbox, kiln: ctx.kiln, containers, after: ctx.after }, input, { onStop: (s) => servers.delete(s) });
      servers.add(server);
      return server;
    },
    async close() {
      await Promise.all([...servers].map((s) => s.stop()));
      servers.clear();
      disposeFrontendCgroups();
      await (await engine?.catch(() => null))?.settle();
    },
  };
}
