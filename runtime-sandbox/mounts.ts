import { existsSync, lstatSync, readlinkSync, realpathSync, statSync } from "node:fs";
import { join, relative, resolve, sep } from "node:path";
import { COMPILED, extractedDir } from "../server/embedded/embedded";
import { rootLinks } from "./runtime-roots";

/**
 * What a sandboxed function or build sees of the filesystem, whatever builds the sandbox
 * (bubblewrap, Kiln's namespace script, a container engine): read-only binds, the merged-/usr
 * symlinks, and covers over hidden paths. /proc, /dev and the private /tmp are each engine's own.
 */

// The compiled binary extracts them once to a content-addressed folder of the cache (a sandboxed
// process reads them from disk).
export const BOOTSTRAP_DIR = COMPILED ? extractedDir("bootstraps") : join(import.meta.dirname, "bootstraps");
const SANDBOX_ETC = COMPILED ? extractedDir("sandbox-etc") : join(import.meta.dirname, "sandbox-etc");

/** Where the code and the bootstraps appear inside the sandbox (Lambda's layout). */
export const TASK_ROOT = "/var/task";
export const RUNTIME_ROOT = "/var/runtime";
/** The uid a function sees; sandbox-etc/passwd names it so getpwuid() works for the function. */
export const SANDBOX_UID = "1000";

/** Inside the sandbox: where the code and the bootstraps are. */
export const SANDBOX_PATHS = { task: TASK_ROOT, runtime: RUNTIME_ROOT, uid: SANDBOX_UID };

export type Mount =
  | { kind: "bind"; src: string; dest: string; writable?: boolean }
  | { kind: "symlink"; target: string; dest: string }
  /** An empty directory over a hidden directory. */
  | { kind: "cover-dir"; dest: string }
  /** /dev/null over a hidden file. */
  | { kind: "cover-file"; dest: string };

/**
 * /usr read-only, and the merged-/usr symlinks (/lib → usr/lib) or the real directories: the host's,
 * or those of a runtime root Kiln provisioned (runtime-roots.ts), which then replaces the host's /usr.
 */
export function systemMountList(root?: string): Mount[] {
  if (root) return [{ kind: "bind", src: join(root, "usr"), dest: "/usr" }, ...rootLinks(root).map((l): Mount => ({ kind: "symlink", target: l.target, dest: l.dest }))];
  const out: Mount[] = [{ kind: "bind", src: "/usr", dest: "/usr" }];
  for (const p of ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"]) {
    try {
      const st = lstatSync(p);
      if (st.isSymbolicLink()) out.push({ kind: "symlink", target: readlinkSync(p), dest: p });
      else if (st.isDirectory()) out.push({ kind: "bind", src: p, dest: p });
    } catch {
      // not on this system
    }
  }
  return out;
}

/** Host files a runtime reads: the dynamic linker's cache, TLS roots, time zone, alternatives. */
const ETC_LINKER = ["/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives"];
// With a runtime root, the linker's files are the root's (or none: its glibc searches its own
// multiarch folders); TLS roots and the time zone stay the host's, so a custom CA still works.
const ETC_HOST = ["/etc/ssl", "/etc/ca-certificates", "/etc/pki", "/etc/localtime"];
const ETC_NETWORK = ["/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/gai.conf", "/etc/host.conf", "/etc/services", "/etc/protocols"];

/**
 * The mount list: the system part (ending with /etc/group: `systemPartLength`), then the runtime,
 * the bootstraps at /var/runtime and the code at /var/task, then the covers over hidden paths.
 */
export function sandboxMounts(
  // The runtime's mounts and root (runtimes.ts ResolvedRuntime; named here, not imported: runtimes.ts loads this module).
  s: { runtime: { mounts: string[]; root?: string }; codeDir: string; network: boolean },
  hiddenPaths: string[],
  opts: { networkEtc?: boolean; codeWritable?: boolean; extra?: Mount[] } = {},
): Mount[] {
  // Never the host root: only what the runtime needs, so Kiln's data dir, the user's home and
  // everything else simply does not exist inside.
  const root = s.runtime.root;
  const m: Mount[] = systemMountList(root);
  for (const p of ETC_LINKER) {
    const src = root ? join(root, p) : p;
    if (existsSync(src)) m.push({ kind: "bind", src: realpathSync(src), dest: p });
  }
  for (const p of [...ETC_HOST, ...(s.network && opts.networkEtc !== false ? ETC_NETWORK : [])]) {
    if (existsSync(p)) m.push({ kind: "bind", src: realpathSync(p), dest: p });
  }
  m.push({ kind: "bind", src: join(SANDBOX_ETC, "passwd"), dest: "/etc/passwd" }, { kind: "bind", src: join(SANDBOX_ETC, "group"), dest: "/etc/group" });
  for (const r of s.runtime.mounts) if (!isUnder(r, "/usr")) m.push({ kind: "bind", src: r, dest: r });
  m.push({ kind: "bind", src: realpathSync(BOOTSTRAP_DIR), dest: RUNTIME_ROOT }, { kind: "bind", src: realpathSync(s.codeDir), dest: TASK_ROOT, writable: !!opts.codeWritable });
  m.push(...(opts.extra ?? []));
  // A hidden path that lies inside something bound (a data dir under the code dir, say) is
  // covered up: an empty directory over a directory, /dev/null over a file.
  const binds = m.filter((x): x is Extract<Mount, { kind: "bind" }> => x.kind === "bind");
  for (const h of hiddenPaths.map(realOrSelf)) {
    if (!existsSync(h)) continue;
    for (const b of binds) {
      if (!isUnder(h, b.src)) continue;
      const dest = join(b.dest, relative(b.src, h));
      let isDir = true;
      try {
        isDir = statSync(h).isDirectory();
      } catch {
        // vanished: cover as a directory
      }
      m.push(isDir ? { kind: "cover-dir", dest } : { kind: "cover-file", dest });
    }
  }
  return m;
}

/** How many leading entries of a sandboxMounts list are the system part (before /proc, /dev, /tmp). */
export function systemPartLength(mounts: Mount[]): number {
  return mounts.findIndex((m) => m.dest === "/etc/group") + 1;
}

export function isUnder(p: string, parent: string): boolean {
  const a = resolve(p);
  const b = resolve(parent);
  return a === b || a.startsWith(b.endsWith(sep) ? b : b + sep);
}

export function realOrSelf(p: string): string {
  try {
    return realpathSync(p);
  } catch {
    return resolve(p);
  }
}
