import { COMPILED, extractedDir } from "../server/embedded/embedded";
import { chmodSync, copyFileSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, symlinkSync } from "node:fs";
import { randomBytes } from "node:crypto";
import { createServer, type Server, type Socket } from "node:net";
import { hostname, tmpdir } from "node:os";
import { basename, join } from "node:path";
import { PassThrough, type Readable } from "node:stream";
import type Docker from "dockerode";
import { DEFAULT_MAX_PROCESSES, pidAlive, runtimeArgv, sandboxEnv, sandboxMounts, SANDBOX_PATHS, type LaunchSpec, type Mount } from "./sandbox";
import { descendants, sandboxProcesses } from "./process-tree";
import { isUnder } from "./mounts";
import type { ResolvedRuntime } from "./runtimes";
import type { ExitStatus, WorkerProcess } from "./worker";

/**
 * The container runtime (production profile): each worker is a container on a Docker or Podman
 * engine, driven through dockerode. The container sees what a bubblewrap sandbox sees (the same
 * mount plan from sandbox.ts: the host's /usr and runtime read-only, bootstraps at /var/runtime,
 * code at /var/task) on top of a tiny base image that only holds the merged-/usr links, the sandbox
 * user and empty mount points. A Python or Ruby runtime served by a runtime root (runtime-roots.ts)
 * runs on that root itself instead: `docker import` of the root's tar, tagged by the root's folder
 * name (runtime name + recipe hash), imported once per engine and reused, so a container runs the
 * same interpreter and libraries as the sandbox. A runtime given by `--runtime-image` runs on that
 * image (its own interpreter, probed once for the exact version). Limits are the engine's: memory (no swap), pids, a sized /tmp, no
 * capabilities, no network unless asked. The protocol channel is a unix socket in a per-worker
 * folder bind-mounted at /run/kiln, so it works with the network switched off.
 *
 * The engine must run on this host: code, runtimes and the channel reach the container as binds.
 * Labels: dev.kiln.worker=1, dev.kiln.owner=<host>/<kiln pid> (orphans of a dead Kiln are removed at
 * the next start), dev.kiln.function=<name>, dev.kiln.version=<function id>:<deployment id>:<region>.
 */

export const DEFAULT_IMAGE = "kiln-runtime:base";
// Modest, and never above Kiln's own hard limits: the engine's are unknown (Podman's service here has
// nproc 32768 while its default for a container is about 4 million, which then fails to apply).
// RLIMIT_NPROC counts every process and thread of uid 1000 on the host, so it cannot be small.
const NOFILE = Math.min(16384, hardLimit("Max open files", 4096));
const NPROC = Math.min(4096, hardLimit("Max processes", 4096));
const CHANNEL_DIR = "/run/kiln";
const LABEL = "dev.kiln.worker";
const OWNER_LABEL = "dev.kiln.owner";

export interface ContainerEngineOptions {
  /** unix:///path, /path, or tcp://host:port; default DOCKER_HOST, then the usual Docker and Podman sockets. */
  host?: string;
  image?: string;
  /** Never visible inside (Kiln's data dir); covered where a bind would expose it. */
  hiddenPaths?: string[];
  /** false: a missing base image is an error instead of being imported (kiln doctor only looks). */
  importImage?: boolean;
  log?: (msg: string) => void;
}

/** Where an engine's API usually is, in the order tried. */
function defaultSockets(): string[] {
  const out = ["/var/run/docker.sock", "/run/podman/podman.sock"];
  if (process.env.XDG_RUNTIME_DIR) out.push(join(process.env.XDG_RUNTIME_DIR, "podman", "podman.sock"));
  return out;
}

/** dockerode's options for an engine address: unix:///path, /path, or tcp://host:port. */
export function dockerOptions(host: string): Docker.DockerOptions {
  if (host.startsWith("unix://")) return { socketPath: host.slice("unix://".length) };
  if (host.startsWith("/")) return { socketPath: host };
  const u = new URL(host.replace(/^tcp:/, "http:"));
  return { host: u.hostname, port: Number(u.port || 2375), protocol: "http" };
}

/** The engine at `host` (else DOCKER_HOST, else the usual sockets) once it answers, or why none did. */
export async function reachEngine(host?: string): Promise<{ docker: Docker; address: string; version: Docker.DockerVersion } | { error: string }> {
  const { default: DockerCtor } = await import("dockerode");
  const candidates = host ? [host] : process.env.DOCKER_HOST ? [process.env.DOCKER_HOST] : defaultSockets();
  const errors: string[] = [];
  for (const address of candidates) {
    const docker = new DockerCtor(dockerOptions(address));
    try {
      return { docker, address, version: await withTimeout(docker.version(), 5000) };
    } catch (e) {
      errors.push(`${address}: ${(e as Error).message}`);
    }
  }
  return { error: `no container engine answered (${errors.join("; ")}); start Docker or Podman, or pass its socket with --docker-host` };
}

// A runtime root's folder name (runtime-roots.ts rootDir): the tag of the image imported from it.
const ROOT_IMAGE_TAG = /^(?:(?:docker\.io\/library|localhost)\/)?kiln-runtime:((?:python|ruby)\d+\.\d+-[0-9a-f]{16})$/;

/**
 * `kiln runtimes prune`: removes the images imported from runtime roots (`kiln-runtime:<root folder>`)
 * whose folder `referenced` no longer knows. The base image and every other image stay; one a
 * container still uses stays too (the engine refuses to remove it) and is reported with the reason.
 */
export async function pruneRootImages(docker: Docker, referenced: (folder: string) => boolean): Promise<{ removed: string[]; kept: Array<{ image: string; reason: string }> }> {
  const removed: string[] = [];
  const kept: Array<{ image: string; reason: string }> = [];
  for (const img of await docker.listImages()) {
    for (const tag of img.RepoTags ?? []) {
      const m = ROOT_IMAGE_TAG.exec(tag);
      if (!m || referenced(m[1]!)) continue;
      try {
        await docker.getImage(tag).remove();
        removed.push(tag);
      } catch (e) {
        kept.push({ image: tag, reason: ((e as { json?: { message?: string } }).json?.message ?? (e as Error).message).trim() });
      }
    }
  }
  return { removed, kept };
}

export class ContainerEngine {
  private constructor(
    readonly docker: Docker,
    readonly address: string,
    readonly image: string,
    readonly version: string,
    private readonly hiddenPaths: string[],
  ) {}

  get podman(): boolean {
    return /podman/i.test(this.version);
  }

  /** Connects, checks the engine answers, makes the base image if it is missing, removes workers left by dead Kiln processes. */
  static async connect(o: ContainerEngineOptions = {}): Promise<ContainerEngine> {
    const found = await reachEngine(o.host);
    if ("error" in found) throw new Error(found.error);
    const { docker, address, version: v } = found;
    const engine = new ContainerEngine(docker, address, o.image ?? DEFAULT_IMAGE, `${v.Components?.[0]?.Name ?? "engine"} ${v.Version} (API ${v.ApiVersion})`, o.hiddenPaths ?? []);
    await engine.ensureImage(o.importImage ?? true, o.log ?? (() => {}));
    await engine.removeOrphans();
    return engine;
  }

  /** The base image, imported from a generated root filesystem when the engine does not have it. */
  private async ensureImage(importIt: boolean, log: (msg: string) => void): Promise<void> {
    try {
      await this.docker.getImage(this.image).inspect();
      return;
    } catch (e) {
      if ((e as { statusCode?: number }).statusCode !== 404) throw e;
    }
    if (!importIt) throw new Error(`the engine has no image ${this.image} (kiln start imports it; or: kiln functions base-image | docker import - ${this.image})`);
    log(`container runtime: importing the base image ${this.image}`);
    const stream = await baseImageTar();
    // The reference goes whole in `repo` (the API allows a tag there): Podman ignores `tag`.
    const res = await this.docker.importImage(stream as unknown as string, { repo: this.image });
    await new Promise<void>((resolve, reject) => this.docker.modem.followProgress(res, (err) => (err ? reject(err) : resolve())));
    await this.docker.getImage(this.image).inspect();
  }

  private async removeOrphans(): Promise<void> {
    const list = await this.docker.listContainers({ all: true, filters: { label: [LABEL] } });
    const host = hostname();
    for (const c of list) {
      const [h, pid] = (c.Labels[OWNER_LABEL] ?? "").split("/");
      if (h !== host || !pid || pidAlive(Number(pid))) continue;
      await this.docker.getContainer(c.Id).remove({ force: true }).catch(() => {});
    }
    // Their channel folders too.
    for (const e of readdirSync(tmpdir())) {
      const m = /^kiln-w-(\d+)-/.exec(e);
      if (m && !pidAlive(Number(m[1]))) rmSync(join(tmpdir(), e), { recursive: true, force: true });
    }
  }

  /** A worker container; `labels` tell operators what it serves (docker ps --filter label=...). */
  launch(spec: LaunchSpec, labels: Record<string, string> = {}): WorkerProcess {
    return new ContainerProcess(this, spec, this.hiddenPaths, labels);
  }

  /**
   * A long-running sandboxed server that is not a function worker (a frontend's Next.js server):
   * created, not started, with the workers' filesystem rules (the mount plan read-only, covers
   * over hidden paths, a sized /tmp), user, capabilities and ulimits, and limits of its own (memory
   * without swap, pids, CPUs). No network; `mounts` marked writable stay writable. Labelled like a
   * worker, so the containers of a dead Kiln are removed at the next start.
   */
  async createSandboxContainer(o: {
    cmd: string[];
    env: Record<string, string>;
    mounts: Mount[];
    hostname: string;
    workingDir: string;
    memoryMb: number;
    cpus: number;
    maxProcesses: number;
    tmpfsMb: number;
    labels: Record<string, string>;
  }): Promise<Docker.Container> {
    const memBytes = o.memoryMb * 1024 * 1024;
    const owner = this.podman ? "mode=1777" : `uid=${SANDBOX_PATHS.uid},gid=${SANDBOX_PATHS.uid}`;
    const tmpfs: Record<string, string> = { "/tmp": `rw,exec,nosuid,nodev,size=${o.tmpfsMb * 1024 * 1024},${owner}` };
    const binds: string[] = [];
    for (const m of o.mounts) {
      if (m.kind === "bind") binds.push(`${m.src}:${m.dest}:${m.writable ? "rw" : "ro"}`);
      else if (m.kind === "cover-dir") tmpfs[m.dest] = "ro,size=4k";
      else if (m.kind === "cover-file") binds.push(`/dev/null:${m.dest}:ro`);
    }
    return this.docker.createContainer({
      Image: this.image,
      Cmd: o.cmd,
      Env: Object.entries(o.env).map(([k, v]) => `${k}=${v}`),
      User: `${SANDBOX_PATHS.uid}:${SANDBOX_PATHS.uid}`,
      WorkingDir: o.workingDir,
      Hostname: o.hostname,
      Labels: { ...o.labels, [LABEL]: "1", [OWNER_LABEL]: `${hostname()}/${process.pid}` },
      AttachStdout: true,
      AttachStderr: true,
      HostConfig: {
        NetworkMode: "none",
        Binds: binds,
        Tmpfs: tmpfs,
        ReadonlyRootfs: true,
        Memory: memBytes,
        MemorySwap: memBytes,
        NanoCpus: Math.round(o.cpus * 1e9),
        PidsLimit: o.maxProcesses,
        CapDrop: ["ALL"],
        SecurityOpt: ["no-new-privileges"],
        Ulimits: [
          { Name: "core", Soft: 0, Hard: 0 },
          { Name: "nofile", Soft: NOFILE, Hard: NOFILE },
          { Name: "nproc", Soft: NPROC, Hard: NPROC },
        ],
      },
    });
  }

  private readonly removals = new Set<Promise<unknown>>();

  /** Container removals still under way; `settle` waits for them (a clean stop leaves no container). */
  track(p: Promise<unknown>): void {
    this.removals.add(p);
    void p.finally(() => this.removals.delete(p));
  }

  async settle(): Promise<void> {
    while (this.removals.size) await Promise.all([...this.removals]);
  }

  describe(): string {
    return `${this.version} at ${this.address}, image ${this.image}`;
  }

  private readonly rootImports = new Map<string, Promise<string>>();

  /** The image a runtime's containers start from: its root's, its --runtime-image, or the base image. */
  imageFor(runtime: Pick<ResolvedRuntime, "root" | "image">, log?: (msg: string) => void): Promise<string> {
    if (runtime.image) return Promise.resolve(runtime.image);
    if (!runtime.root) return Promise.resolve(this.image);
    const root = runtime.root;
    let p = this.rootImports.get(root);
    if (!p) {
      p = this.importRoot(root, log ?? (() => {}));
      this.rootImports.set(root, p);
      // A failed import is tried again by the next use.
      p.catch(() => this.rootImports.delete(root));
    }
    return p;
  }

  /** `kiln-runtime:<name>-<recipe hash>`: a root folder's name is its content address. */
  static rootImageTag(root: string): string {
    return `kiln-runtime:${basename(root)}`;
  }

  private async importRoot(root: string, log: (msg: string) => void): Promise<string> {
    const tag = ContainerEngine.rootImageTag(root);
    try {
      await this.docker.getImage(tag).inspect();
      return tag;
    } catch (e) {
      if ((e as { statusCode?: number }).statusCode !== 404) throw e;
    }
    const t0 = Date.now();
    log(`container runtime: importing the runtime root ${root} as the image ${tag}`);
    const res = await this.docker.importImage((await rootImageTar(root)) as unknown as string, { repo: tag });
    await new Promise<void>((resolve, reject) => this.docker.modem.followProgress(res, (err) => (err ? reject(err) : resolve())));
    await this.docker.getImage(tag).inspect();
    log(`container runtime: imported ${tag} in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
    return tag;
  }

  private readonly imageProbes = new Map<string, Promise<ResolvedRuntime | { missing: string }>>();

  /**
   * A runtime served by `--runtime-image name=image`: the image (pulled if the engine lacks it) and
   * the interpreter on its PATH (`python3.12`, `python3`, `python` / `ruby`), run once to check it
   * is exactly the version the name says. Remembered for the life of the process.
   */
  runtimeFromImage(name: string, kind: "python" | "ruby", want: string, image: string): Promise<ResolvedRuntime | { missing: string }> {
    const key = `${name}=${image}`;
    let p = this.imageProbes.get(key);
    if (!p) {
      p = this.probeImage(name, kind, want, image);
      this.imageProbes.set(key, p);
      // Misses are not remembered: pulling or tagging the image later takes effect.
      void p.then((r) => "missing" in r && this.imageProbes.delete(key));
    }
    return p;
  }

  private async probeImage(name: string, kind: "python" | "ruby", want: string, image: string): Promise<ResolvedRuntime | { missing: string }> {
    const label = kind === "python" ? "Python" : "Ruby";
    try {
      await this.docker.getImage(image).inspect();
    } catch (e) {
      if ((e as { statusCode?: number }).statusCode !== 404) return { missing: `${label} ${want} (--runtime-image ${name}=${image}: ${(e as Error).message})` };
      try {
        const res = await this.docker.pull(image);
        await new Promise<void>((resolve, reject) => this.docker.modem.followProgress(res, (err) => (err ? reject(err) : resolve())));
      } catch (pe) {
        return { missing: `${label} ${want} (--runtime-image ${name}=${image}: the engine has no image ${image} and pulling it failed: ${firstLine((pe as Error).message)}; docker pull ${image}, or docker load it)` };
      }
    }
    // The name's own binary first, then the generic ones, then any other minor version (to say which one the image has).
    const others = kind === "python" ? ["3.10", "3.11", "3.12", "3.13", "3.14"].filter((v) => v !== want).map((v) => `python${v}`) : ["3.3", "3.4", "4.0"].filter((v) => v !== want).map((v) => `ruby${v}`);
    const candidates = [...(kind === "python" ? [`python${want}`, "python3", "python"] : [`ruby${want}`, "ruby"]), ...others];
    const code = kind === "python" ? ["-c", "import sys, platform; print(sys.executable); print(platform.python_version())"] : ["-e", "puts RbConfig.ruby; puts RUBY_VERSION"];
    // One container through the image's /bin/sh when it has one; else one per candidate (a distroless image).
    const viaShell = await this.runOnce(image, ["/bin/sh", "-c", `for c in ${candidates.join(" ")}; do if command -v "$c" >/dev/null 2>&1; then exec "$c" "$@"; fi; done; exit 127`, "probe", ...code]).catch(() => null);
    let out = viaShell?.code === 0 ? viaShell.out : null;
    if (!viaShell || viaShell.code === 126 || (viaShell.code === 127 && !viaShell.out)) {
      for (const c of viaShell ? [] : candidates) {
        const r = await this.runOnce(image, [c, ...code]).catch(() => null);
        if (r?.code === 0) {
          out = r.out;
          break;
        }
      }
    }
    const [executable, version] = (out ?? "").trim().split(/\r?\n/).map((l) => l.trim());
    if (!executable || !version) return { missing: `${label} ${want} (--runtime-image ${name}=${image}: none of ${candidates.slice(0, kind === "python" ? 3 : 2).join(", ")} runs in that image)` };
    if (version.split(".").slice(0, 2).join(".") !== want) return { missing: `${label} ${want} (--runtime-image ${name}=${image} runs ${label} ${version}, another version)` };
    return {
      kind,
      command: executable,
      version,
      mounts: [],
      image,
      source: `image ${image}`,
      ...(kind === "python" ? { pip: [executable, "-m", "pip"] } : { bundle: [executable, "-S", "bundle"] }),
    };
  }

  /** Runs a command in a throw-away container of `image` (no network, as the sandbox user); its exit code and stdout. */
  private async runOnce(image: string, cmd: string[]): Promise<{ code: number; out: string }> {
    const c = await this.docker.createContainer({
      Image: image,
      Cmd: cmd,
      User: `${SANDBOX_PATHS.uid}:${SANDBOX_PATHS.uid}`,
      Env: ["LANG=C.UTF-8", "HOME=/tmp"],
      Labels: { [LABEL]: "1", [OWNER_LABEL]: `${hostname()}/${process.pid}` },
      HostConfig: {
        NetworkMode: "none",
        ReadonlyRootfs: true,
        Tmpfs: { "/tmp": "rw,size=16m,mode=1777" },
        CapDrop: ["ALL"],
        SecurityOpt: ["no-new-privileges"],
        // As for workers: Podman's own defaults fail to apply under lower engine limits.
        Ulimits: [
          { Name: "nofile", Soft: NOFILE, Hard: NOFILE },
          { Name: "nproc", Soft: NPROC, Hard: NPROC },
        ],
      },
    });
    try {
      await c.start();
      const r = (await withTimeout(c.wait(), 60_000)) as { StatusCode?: number };
      const logs = (await c.logs({ stdout: true, stderr: false, follow: false })) as unknown as Buffer;
      return { code: r.StatusCode ?? -1, out: demux(Buffer.from(logs)) };
    } finally {
      await c.remove({ force: true }).catch(() => {});
    }
  }
}

/** The payload of a multiplexed (non-TTY) log buffer: 8-byte headers (stream, 0, 0, 0, size BE) before each frame. */
function demux(b: Buffer): string {
  // Podman may answer a container's logs unframed: then the bytes are the output itself.
  if (b.length < 8 || b[0]! > 2 || b[1] !== 0 || b[2] !== 0 || b[3] !== 0) return b.toString();
  const parts: Buffer[] = [];
  for (let i = 0; i + 8 <= b.length; ) {
    const size = b.readUInt32BE(i + 4);
    parts.push(b.subarray(i + 8, i + 8 + size));
    i += 8 + size;
  }
  return Buffer.concat(parts).toString();
}

function firstLine(s: string): string {
  return s.split("\n")[0]!.slice(0, 300);
}

// ---------------------------------------------------------------------------------------------

class ContainerProcess implements WorkerProcess {
  readonly stdout = new PassThrough();
  readonly stderr = new PassThrough();
  readonly channel: Promise<Socket>;
  private container: Docker.Container | null = null;
  private server: Server | null = null;
  private readonly dir: string;
  private pid: number | null = null;
  private killed = false;
  private status: ExitStatus | null = null;
  private exitListeners: Array<(s: ExitStatus) => void> = [];
  private closeListeners: Array<() => void> = [];
  private closed = false;
  private resolveChannel!: (s: Socket) => void;
  private rejectChannel!: (e: Error) => void;

  constructor(
    private readonly engine: ContainerEngine,
    private readonly spec: LaunchSpec,
    private readonly hiddenPaths: string[],
    private readonly labels: Record<string, string>,
  ) {
    // Short: a unix socket path is limited to about 100 bytes.
    this.dir = mkdtempSync(join(tmpdir(), `kiln-w-${process.pid}-`));
    this.channel = new Promise<Socket>((resolve, reject) => {
      this.resolveChannel = resolve;
      this.rejectChannel = reject;
    });
    this.channel.catch(() => {});
    this.start().catch((e: Error) => this.exit({ code: null, signal: null, error: e.message, oomKilled: false }));
  }

  private async start(): Promise<void> {
    chmodSync(this.dir, 0o755);
    const socketPath = join(this.dir, "channel.sock");
    // The socket must be open to uid 1000, and so to any host user with that uid: a connection only
    // becomes the channel once its first line is the hello with this worker's token (which only the
    // container's environment holds; the bootstrap sends it before loading any user code).
    const token = randomBytes(24).toString("hex");
    const server = createServer({ allowHalfOpen: false }, (sock) => {
      let first = "";
      const timer = setTimeout(() => sock.destroy(), 10_000);
      const onData = (d: Buffer) => {
        first += d.toString("latin1");
        const nl = first.indexOf("\n");
        if (nl < 0) {
          if (first.length > 4096) sock.destroy();
          return;
        }
        sock.off("data", onData);
        clearTimeout(timer);
        let hello: { t?: string; token?: string } = {};
        try {
          hello = JSON.parse(first.slice(0, nl));
        } catch {
          // not a hello
        }
        if (hello.t !== "hello" || hello.token !== token) return void sock.destroy();
        server.close();
        sock.pause();
        const rest = Buffer.from(first.slice(nl + 1), "latin1");
        if (rest.length) sock.unshift(rest);
        this.resolveChannel(sock);
      };
      sock.on("data", onData);
      sock.on("error", () => {});
    });
    this.server = server;
    await new Promise<void>((resolve, reject) => server.once("error", reject).listen(socketPath, resolve));
    chmodSync(socketPath, 0o777); // the sandbox user (uid 1000) connects to it
    if (this.killed) throw new Error("stopped before it started");

    const s = this.spec;
    const memBytes = s.limits.memoryMb * 1024 * 1024;
    const binds: string[] = [];
    // Writable by the sandbox user. Docker 20.10 ignores mode= on a tmpfs but takes uid=/gid=;
    // Podman refuses uid= but honours mode=.
    const owner = this.engine.podman ? "mode=1777" : `uid=${SANDBOX_PATHS.uid},gid=${SANDBOX_PATHS.uid}`;
    const tmpfs: Record<string, string> = { "/tmp": `rw,exec,nosuid,nodev,size=${memBytes},${owner}` };
    const image = await this.engine.imageFor(s.runtime);
    if (this.killed) throw new Error("stopped before it started");
    // On a root's (or a --runtime-image's) image the system is the image's own: no host /usr, no
    // root folder bound over it.
    const own = (m: { src: string; dest: string }) =>
      s.runtime.image ? ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives"].some((d) => isUnder(m.dest, d)) : !!s.runtime.root && isUnder(m.src, s.runtime.root);
    for (const m of sandboxMounts(s, this.hiddenPaths, { networkEtc: false })) {
      if (m.kind === "bind" && own(m)) continue;
      if (m.kind === "bind") binds.push(`${m.src}:${m.dest}:ro`);
      else if (m.kind === "cover-dir") tmpfs[m.dest] = "ro,size=4k";
      else if (m.kind === "cover-file") binds.push(`/dev/null:${m.dest}:ro`);
      // symlinks: part of the base image (made from this host's layout)
    }
    binds.push(`${this.dir}:${CHANNEL_DIR}`);
    const env = { ...sandboxEnv(s), KILN_CHANNEL: `${CHANNEL_DIR}/channel.sock`, KILN_CHANNEL_TOKEN: token };
    const container = await this.engine.docker.createContainer({
      Image: image,
      Cmd: runtimeArgv(s, SANDBOX_PATHS),
      Env: Object.entries(env).map(([k, v]) => `${k}=${v}`),
      User: `${SANDBOX_PATHS.uid}:${SANDBOX_PATHS.uid}`,
      WorkingDir: SANDBOX_PATHS.task,
      Hostname: "kiln-function",
      Labels: { ...this.labels, [LABEL]: "1", [OWNER_LABEL]: `${hostname()}/${process.pid}` },
      AttachStdout: true,
      AttachStderr: true,
      HostConfig: {
        NetworkMode: s.network ? "default" : "none",
        Binds: binds,
        Tmpfs: tmpfs,
        ReadonlyRootfs: true,
        Memory: memBytes,
        MemorySwap: memBytes, // no swap: a hog is killed, not paged out
        PidsLimit: s.limits.maxProcesses ?? DEFAULT_MAX_PROCESSES,
        CapDrop: ["ALL"],
        SecurityOpt: ["no-new-privileges"],
        // nofile and nproc set explicitly: Podman's defaults (about a million each) fail to apply
        // where the engine's own limits are lower. Processes are capped by PidsLimit anyway.
        Ulimits: [
          { Name: "core", Soft: 0, Hard: 0 },
          { Name: "nofile", Soft: NOFILE, Hard: NOFILE },
          { Name: "nproc", Soft: NPROC, Hard: NPROC },
        ],
      },
    });
    this.container = container;
    if (this.killed) throw new Error("stopped before it started");
    const stream = (await container.attach({ stream: true, stdout: true, stderr: true })) as unknown as Readable;
    this.engine.docker.modem.demuxStream(stream, this.stdout, this.stderr);
    stream.on("end", () => this.close());
    stream.on("error", () => this.close());
    await container.start();
    const info = await container.inspect();
    this.pid = info.State.Pid || null;
    container.wait().then(
      async (r: { StatusCode?: number }) => {
        const after = await container.inspect().catch(() => null);
        this.exit({ code: r.StatusCode ?? null, signal: null, oomKilled: !!after?.State.OOMKilled });
      },
      (e: Error) => this.exit({ code: null, signal: null, error: e.message, oomKilled: false }),
    );
    if (this.killed) void container.kill().catch(() => {});
  }

  onExit(l: (s: ExitStatus) => void): void {
    if (this.status) l(this.status);
    else this.exitListeners.push(l);
  }

  onClose(l: () => void): void {
    if (this.closed) l();
    else this.closeListeners.push(l);
  }

  kill(): void {
    this.killed = true;
    void this.container?.kill().catch(() => {});
  }

  /**
   * The runtime is the container's pid 1 and reaps nothing it did not start, so what a function left
   * running is killed from the host where Kiln may (the engine on this host, Kiln root or the same
   * uid) and the container is not reused: its next invocation gets a fresh one. The container's own
   * /proc is looked at first (one read); a rootless engine's containers may be out of Kiln's reach.
   */
  killStrays(): number | "replace" {
    if (!this.pid || this.status || sandboxProcesses(this.pid) === 1) return 0;
    const strays = descendants(this.pid);
    if (!strays.length) return 0;
    for (const pid of strays) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // gone, or not Kiln's to signal: the container's kill takes it
      }
    }
    return "replace";
  }

  cleanup(): void {
    this.server?.close();
    rmSync(this.dir, { recursive: true, force: true });
    if (this.container) this.engine.track(this.container.remove({ force: true }).catch(() => {}));
  }

  runtimePid(): number | null {
    return this.pid;
  }

  private exit(s: ExitStatus): void {
    if (this.status) return;
    this.status = s;
    this.rejectChannel(new Error("the container ended"));
    this.server?.close();
    for (const l of this.exitListeners.splice(0)) l(s);
    // Without an attached stream (creation failed) nothing else will end the output.
    if (!this.container) this.close();
  }

  private close(): void {
    if (this.closed) return;
    this.closed = true;
    this.stdout.end();
    this.stderr.end();
    for (const l of this.closeListeners.splice(0)) l();
  }
}

// ---------------------------------------------------------------------------------------------
// The base image

/**
 * The root filesystem of the base image as a tar stream: this host's merged-/usr links (or empty
 * directories where /lib and friends are real ones, to bind over), the sandbox user, and the empty
 * mount points. Everything else arrives as read-only binds, so the image never goes stale.
 */
export async function baseImageTar(): Promise<Readable> {
  const { create } = await import("tar");
  const root = mkdtempSync(join(tmpdir(), "kiln-rootfs-"));
  for (const d of ["etc", "tmp", "proc", "dev", "sys", "run/kiln", "usr", "var/task", "var/runtime"]) mkdirSync(join(root, d), { recursive: true });
  chmodSync(join(root, "tmp"), 0o1777);
  for (const p of ["bin", "sbin", "lib", "lib32", "lib64", "libx32"]) {
    try {
      const st = lstatSync(`/${p}`);
      if (st.isSymbolicLink()) symlinkSync(readlinkSync(`/${p}`), join(root, p));
      else if (st.isDirectory()) mkdirSync(join(root, p));
    } catch {
      // not on this system
    }
  }
  for (const f of ["passwd", "group"]) copyFileSync(join(COMPILED ? extractedDir("sandbox-etc") : join(import.meta.dirname, "sandbox-etc"), f), join(root, "etc", f));
  const stream = create({ cwd: root, portable: true, gzip: false }, ["."]) as unknown as Readable;
  stream.on("end", () => rmSync(root, { recursive: true, force: true }));
  return stream;
}

/**
 * A runtime root as an image's tar: the root as it is (merged-/usr links, its own /etc). The sandbox
 * user's passwd/group arrive as binds, as in every sandbox, and the engine makes the mount points.
 */
export async function rootImageTar(root: string): Promise<Readable> {
  const { create } = await import("tar");
  const top = readdirSync(root).filter((e) => e !== "kiln-root.json");
  // portable: no host uids or times; the files are root's inside, as Debian ships them. Device nodes
  // (mmdebstrap's /dev) are left out: the engine makes the container's /dev, and opening them to
  // archive would read the host's devices.
  const filter = (_p: string, st: { isCharacterDevice?: () => boolean; isBlockDevice?: () => boolean; isFIFO?: () => boolean; isSocket?: () => boolean }) =>
    !(st.isCharacterDevice?.() || st.isBlockDevice?.() || st.isFIFO?.() || st.isSocket?.());
  return create({ cwd: root, portable: true, gzip: false, filter: filter as never }, top) as unknown as Readable;
}

function withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
  return Promise.race([p, new Promise<T>((_, reject) => setTimeout(() => reject(new Error(`no answer in ${ms} ms`)), ms).unref?.())]);
}

/** One of this process's hard rlimits, from /proc (Node has no getrlimit); "unlimited" → 1<<20. */
function hardLimit(name: string, fallback: number): number {
  try {
    const line = readFileSync("/proc/self/limits", "utf8").split("\n").find((l) => l.startsWith(name));
    const hard = line?.slice(name.length).trim().split(/\s+/)[1];
    if (!hard) return fallback;
    return hard === "unlimited" ? 1 << 20 : Number(hard);
  } catch {
    return fallback;
  }
}
