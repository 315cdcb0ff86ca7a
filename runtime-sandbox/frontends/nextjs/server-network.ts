import { randomBytes } from "node:crypto";
import { chmodSync, chownSync, mkdirSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { createServer, connect, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join, posix } from "node:path";
import { startBuildEgress, type BuildEgress } from "../../build-egress";
import { pidAlive } from "../../cgroups";
import { sandboxUser } from "../../isolation";
import { RUNTIME_ROOT, type Mount } from "../../mounts";

/**
 * The network of a sandboxed Next.js server: a namespace of its own with only a private loopback,
 * and three unix sockets as its doors (bootstraps/frontend-relay.cjs is the inside end):
 *
 * - `app.sock`: made by the relay inside once the server listens; Kiln proxies site requests to it.
 * - `kiln.sock`: Kiln's end pipes each connection to Kiln's own HTTP listener; inside, the relay
 *   listens on loopback at Kiln's port number, so `http://127.0.0.1:<port>/fn/...` (a function's
 *   `invoke_url`) works unchanged from a server component.
 * - `egress.sock`: the build egress proxy (build-egress.ts), Node's fetch proxy for everything
 *   else; it refuses loopback, private and this host's addresses, except Kiln's public URL.
 *
 * So the server reaches Kiln's HTTP API and the internet, and nothing else of the host: Kiln's
 * PostgreSQL wire port and any other loopback service are absent from its namespace.
 */

/** Where the folders appear inside the sandbox. */
const OUT_INSIDE = "/run/kiln-frontend";
const IN_INSIDE = "/run/kiln-frontend-app";

let swept = false;
/** The relay folders of Kiln processes that are gone (killed outright: nothing removed them). */
function sweepOnce(): void {
  if (swept) return;
  swept = true;
  try {
    for (const e of readdirSync(tmpdir())) {
      const m = /^kiln-fe-(\d+)-/.exec(e);
      if (m && Number(m[1]) !== process.pid && !pidAlive(Number(m[1]))) rmSync(join(tmpdir(), e), { recursive: true, force: true });
    }
  } catch {
    // an unreadable /tmp: nothing to sweep
  }
}

export interface KilnAddress {
  /** What Kiln's HTTP server listens on (0.0.0.0 / :: are reached at loopback). */
  host: string;
  port: number;
  /** Kiln's public URL: let through the egress even when its host is local. */
  publicUrl: string;
}

export interface ServerNetwork {
  /** Kiln's end of the inbound relay. */
  appSocket: string;
  mounts: Mount[];
  /** Environment for the server: PORT/HOSTNAME, the proxy variables and the relay's configuration. */
  env: Record<string, string>;
  /** node argv before the entry: the relay preload. */
  nodeArgs: string[];
  close(): Promise<void>;
}

export async function openServerNetwork(kiln: KilnAddress | null, log: (m: string) => void, o: { uid?: number } = {}): Promise<ServerNetwork> {
  sweepOnce();
  // Short paths under /tmp: a unix socket path has 107 bytes at most. Kiln's pid in the name: a
  // crashed Kiln's folders are removed by the next one.
  const dir = mkdtempSync(join(tmpdir(), `kiln-fe-${process.pid}-`));
  const out = join(dir, "out");
  // The relay makes app.sock here: the sandbox's user must write in it, Kiln's own sockets stay out of its reach.
  const inbound = join(dir, `in-${randomBytes(6).toString("hex")}`);
  const owner = o.uid !== undefined ? { uid: o.uid, gid: o.uid } : sandboxUser();
  const self = process.getuid?.();
  if (owner && self === 0) {
    chmodSync(dir, 0o755);
    mkdirSync(inbound, { mode: 0o700 });
    chownSync(inbound, owner.uid, owner.gid);
  } else if (owner && owner.uid !== self) {
    // A container's uid that Kiln cannot hand the folder to: open, under a name nobody can list.
    chmodSync(dir, 0o711);
    mkdirSync(inbound, { mode: 0o777 });
    chmodSync(inbound, 0o777);
  } else {
    chmodSync(dir, 0o755);
    mkdirSync(inbound, { mode: 0o700 });
  }
  let egress: BuildEgress | null = null;
  let kilnRelay: Server | null = null;
  const open = new Set<Socket>();
  try {
    const allowHosts: string[] = [];
    if (kiln?.publicUrl) {
      try {
        const u = new URL(kiln.publicUrl);
        allowHosts.push(`${u.hostname}:${u.port || (u.protocol === "https:" ? 443 : 80)}`);
      } catch {
        // not a URL: nothing to allow
      }
    }
    egress = await startBuildEgress({ socketDir: out, allowHosts, log: (m) => log(m.replace(/^build egress/, "egress").replace("builds may only reach public addresses", "the server reaches only Kiln and public addresses")) });
    const kilnSocket = join(out, "kiln.sock");
    if (kiln) {
      const target = { host: kiln.host === "0.0.0.0" || kiln.host === "" ? "127.0.0.1" : kiln.host === "::" ? "::1" : kiln.host, port: kiln.port };
      kilnRelay = createServer((client) => {
        const upstream = connect(target);
        for (const s of [client, upstream]) {
          open.add(s);
          s.on("close", () => open.delete(s));
          s.on("error", () => {
            client.destroy();
            upstream.destroy();
          });
        }
        client.pipe(upstream);
        upstream.pipe(client);
      });
      await new Promise<void>((resolve, reject) => {
        kilnRelay!.once("error", reject);
        kilnRelay!.listen(kilnSocket, () => resolve());
      });
      chmodSync(kilnSocket, 0o666);
    }
    // Any port is free in a namespace of its own; these only avoid Kiln's number.
    const kilnPort = kiln?.port ?? 0;
    const appPort = kilnPort === 3000 ? 3001 : 3000;
    const proxyPort = kilnPort === 3128 ? 3129 : 3128;
    const proxy = `http://127.0.0.1:${proxyPort}`;
    const relay = {
      appPort,
      appSocket: posix.join(IN_INSIDE, "app.sock"),
      kilnPort: kiln ? kilnPort : 0,
      kilnSocket: posix.join(OUT_INSIDE, "kiln.sock"),
      proxyPort,
      egressSocket: posix.join(OUT_INSIDE, "egress.sock"),
    };
    const env: Record<string, string> = {
      PORT: String(appPort),
      HOSTNAME: "127.0.0.1",
      HTTP_PROXY: proxy,
      HTTPS_PROXY: proxy,
      http_proxy: proxy,
      https_proxy: proxy,
      // Loopback is the relayed Kiln port (direct); everything else goes through the egress.
      NO_PROXY: "localhost,127.0.0.1,::1",
      no_proxy: "localhost,127.0.0.1,::1",
      NODE_USE_ENV_PROXY: "1",
      KILN_RELAY: JSON.stringify(kiln ? relay : { ...relay, kilnPort: 0 }),
    };
    const self = egress;
    const relayServer = kilnRelay;
    return {
      appSocket: join(inbound, "app.sock"),
      mounts: [
        { kind: "bind", src: out, dest: OUT_INSIDE },
        { kind: "bind", src: inbound, dest: IN_INSIDE, writable: true },
      ],
      env,
      nodeArgs: ["--require", posix.join(RUNTIME_ROOT, "frontend-relay.cjs")],
      close: async () => {
        for (const s of open) s.destroy();
        await new Promise<void>((r) => (relayServer ? relayServer.close(() => r()) : r()));
        await self.close();
        rmSync(dir, { recursive: true, force: true });
      },
    };
  } catch (e) {
    kilnRelay?.close();
    await egress?.close();
    rmSync(dir, { recursive: true, force: true });
    throw e;
  }
}
