import { chmodSync, copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { homedir, tmpdir } from "node:os";
import { dirname, join } from "node:path";
import type { Mount } from "./mounts";

/**
 * The host's package-manager configuration, as a build sees it. A user behind a mirror or a proxy
 * has it in npm's .npmrc, pip's pip.conf, bundler's config and the environment; the build sandbox
 * starts from a cleared environment and a private HOME, so without this a build ignored all of it.
 *
 * - Settings in the environment that choose a registry, its credentials, TLS trust and retries are
 *   passed (PASSED); paths, caches, install targets and proxies are not.
 * - Files and folders those settings name (CA files, pip's constraints, a wheel folder, a file://
 *   index) are shown read-only at their own path.
 * - Config files are copied (0444, in a folder of their own made per build) and shown read-only in
 *   the sandbox at /run/kiln-config, with the environment variable that makes the tool read them
 *   there. A copy, because the originals may be readable by Kiln's user only (the sandbox runs as
 *   uid 1000) and must not change under a running build.
 * - Registries they name are hosts the build egress lets through even when local (a mirror
 *   configured on purpose), like KILN_BUILD_ALLOW_HOSTS.
 * - A proxy they name (HTTPS_PROXY/HTTP_PROXY first, then .npmrc's https-proxy/proxy, then
 *   pip.conf's proxy) becomes the build egress's upstream: the egress stays the only way out.
 */

export const CONFIG_IN_SANDBOX = "/run/kiln-config";

// Environment settings passed into builds, case as given. Proxies are the egress's upstream instead.
const PASSED = [
  /^npm_config_(registry|@[^:]+:registry|cafile|ca|strict_ssl|fetch_retries|fetch_retry_factor|fetch_retry_mintimeout|fetch_retry_maxtimeout|fetch_timeout|maxsockets|_auth|_authtoken|always_auth|replace_registry_host)$/i,
  /^PIP_(INDEX_URL|EXTRA_INDEX_URL|TRUSTED_HOST|CERT|CLIENT_CERT|FIND_LINKS|NO_INDEX|RETRIES|TIMEOUT|DEFAULT_TIMEOUT|PREFER_BINARY|ONLY_BINARY|NO_BINARY|PRE|DISABLE_PIP_VERSION_CHECK)$/,
  /^BUNDLE_(MIRROR__.*|SSL_CA_CERT|SSL_VERIFY_MODE|RETRY|TIMEOUT)$/,
  /^(NODE_EXTRA_CA_CERTS|SSL_CERT_FILE|SSL_CERT_DIR|REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE)$/,
];
// Of those, the ones that name a host file or folder the sandbox must show (read-only, same path).
const PATH_VALUED = /CAFILE|CERT|CA_BUNDLE|CA_CERTS|FIND_LINKS|SSL_CERT_DIR/i;

export interface ConfigFile {
  /** Where Kiln read it. */
  src: string;
  /** Its place under the per-build config folder. */
  name: string;
  /** The variable that points the tool at it, with the path relative to the config folder. */
  env?: [string, string];
  /** Or a fixed path the tool reads (shown there in the sandbox). */
  at?: string;
}

export interface HostBuildConfig {
  env: Record<string, string>;
  /** Host paths named by passed settings (CA files, a wheel folder): shown read-only at the same path. */
  readOnly: string[];
  files: ConfigFile[];
  /** host:port of registries the configuration names. */
  registryHosts: string[];
  upstreamProxy: string | null;
  noProxy: string | null;
}

type Env = Record<string, string | undefined>;

const first = (...ps: (string | undefined)[]) => ps.find((p): p is string => !!p && isFile(p));

function isFile(p: string): boolean {
  try {
    return statSync(p).isFile();
  } catch {
    return false;
  }
}

/** What of the host's package-manager configuration a build gets. */
export function hostBuildConfig(env: Env = process.env, home = env.HOME || homedir()): HostBuildConfig {
  const out: Record<string, string> = {};
  const readOnly = new Set<string>();
  for (const [k, v] of Object.entries(env)) {
    if (v === undefined || !PASSED.some((r) => r.test(k))) continue;
    out[k] = v;
    if (PATH_VALUED.test(k) && v.startsWith("/") && existsSync(v)) readOnly.add(v);
  }

  const files: ConfigFile[] = [];
  const npmUser = first(env.NPM_CONFIG_USERCONFIG, env.npm_config_userconfig, join(home, ".npmrc"));
  if (npmUser) files.push({ src: npmUser, name: "npmrc", env: ["npm_config_userconfig", "npmrc"] });
  const npmGlobal = first(env.NPM_CONFIG_GLOBALCONFIG, env.npm_config_globalconfig, "/etc/npmrc");
  if (npmGlobal) files.push({ src: npmGlobal, name: "npmrc-global", env: ["npm_config_globalconfig", "npmrc-global"] });
  const pipFile = first(env.PIP_CONFIG_FILE);
  if (pipFile) files.push({ src: pipFile, name: "pip.conf", env: ["PIP_CONFIG_FILE", "pip.conf"] });
  const pipUser = first(env.XDG_CONFIG_HOME && join(env.XDG_CONFIG_HOME, "pip", "pip.conf"), join(home, ".config", "pip", "pip.conf"), join(home, ".pip", "pip.conf"));
  if (pipUser) files.push({ src: pipUser, name: "xdg/pip/pip.conf", env: ["XDG_CONFIG_HOME", "xdg"] });
  for (const g of ["/etc/pip.conf", "/etc/xdg/pip/pip.conf"]) if (isFile(g)) files.push({ src: g, name: `etc${g.replaceAll("/", "-")}`, at: g });
  const bundle = first(env.BUNDLE_USER_CONFIG, join(home, ".bundle", "config"));
  if (bundle) files.push({ src: bundle, name: "bundle-config", env: ["BUNDLE_USER_CONFIG", "bundle-config"] });

  // Registries, proxies and no-proxy lists the files name.
  const hosts = new Set<string>(registryHosts(Object.entries(out).filter(([k]) => /registry|INDEX_URL|FIND_LINKS|MIRROR/i.test(k)).map(([, v]) => v)));
  let fileProxy: string | null = null;
  let fileNoProxy: string | null = null;
  for (const f of files) {
    let text: string;
    try {
      text = readFileSync(f.src, "utf8");
    } catch {
      continue;
    }
    const kv = f.name.startsWith("npmrc") ? npmrcValues(text) : f.name === "bundle-config" ? bundleValues(text) : iniValues(text);
    const urls = kv.filter(([k]) => /(^|:)registry$|^(index-url|extra-index-url|find-links)$|^BUNDLE_MIRROR__/i.test(k)).map(([, v]) => v);
    for (const h of registryHosts(urls)) hosts.add(h);
    // Files and folders a setting names (a CA file, pip's constraints, a wheel folder, a file:// index) are shown where they are.
    for (const [, v] of kv) for (const p of localPaths(v)) readOnly.add(p);
    fileProxy ??= kv.find(([k]) => k === "https-proxy")?.[1] ?? kv.find(([k]) => k === "proxy")?.[1] ?? null;
    fileNoProxy ??= kv.find(([k]) => k === "noproxy")?.[1] ?? null;
  }
  const envProxy = env.HTTPS_PROXY || env.https_proxy || env.HTTP_PROXY || env.http_proxy || null;
  return {
    env: out,
    readOnly: [...readOnly],
    files,
    registryHosts: [...hosts],
    upstreamProxy: envProxy || fileProxy || null,
    noProxy: env.NO_PROXY ?? env.no_proxy ?? fileNoProxy,
  };
}

/** `key = value` lines of an .npmrc (comments `#`/`;`; quotes dropped). */
function npmrcValues(text: string): [string, string][] {
  const out: [string, string][] = [];
  for (const raw of text.split(/\r?\n/)) {
    const line = raw.trim();
    if (!line || line.startsWith("#") || line.startsWith(";")) continue;
    const i = line.indexOf("=");
    if (i < 0) continue;
    out.push([line.slice(0, i).trim(), line.slice(i + 1).trim().replace(/^"(.*)"$/, "$1")]);
  }
  return out;
}

/** pip.conf (INI): every section's `key = value`, with indented continuation lines joined. */
function iniValues(text: string): [string, string][] {
  const out: [string, string][] = [];
  for (const raw of text.split(/\r?\n/)) {
    if (!raw.trim() || /^\s*[#;]/.test(raw) || /^\s*\[/.test(raw)) continue;
    const last = out[out.length - 1];
    if (/^\s/.test(raw) && last) {
      last[1] += ` ${raw.trim()}`;
      continue;
    }
    const m = /^([^=:]+)[=:](.*)$/.exec(raw);
    if (m) out.push([m[1]!.trim().toLowerCase(), m[2]!.trim()]);
  }
  return out;
}

/** Bundler's config (YAML of `KEY: "value"` lines). */
function bundleValues(text: string): [string, string][] {
  const out: [string, string][] = [];
  for (const raw of text.split(/\r?\n/)) {
    const m = /^\s*([A-Z0-9_]+):\s*"?([^"]*)"?\s*$/.exec(raw);
    if (m) out.push([m[1]!, m[2]!]);
  }
  return out;
}

/** Existing absolute host paths in a setting's value: plain, or as file:// URLs. */
function localPaths(value: string): string[] {
  const out: string[] = [];
  for (const word of value.split(/[\s,]+/)) {
    let p = word;
    if (p.startsWith("file://")) {
      try {
        p = decodeURIComponent(new URL(p).pathname);
      } catch {
        continue;
      }
    }
    if (p.startsWith("/") && !/^\/(proc|sys|dev|run)?(\/|$)/.test(p) && existsSync(p)) out.push(p.replace(/\/+$/, ""));
  }
  return out;
}

/** host:port of every http(s) URL in `values`. */
export function registryHosts(values: string[]): string[] {
  const out = new Set<string>();
  for (const v of values) {
    for (const word of v.split(/[\s,]+/)) {
      try {
        const u = new URL(word);
        if (u.protocol === "http:" || u.protocol === "https:") out.add(`${u.hostname}:${u.port || (u.protocol === "https:" ? 443 : 80)}`);
      } catch {
        // not a URL (a local path, say)
      }
    }
  }
  return [...out];
}

export interface StagedConfig {
  /** Environment for the installer: the passed settings plus the variables naming the copies. */
  env: Record<string, string>;
  /** For a sandboxed build: the copies' folder at /run/kiln-config, and fixed-path files. */
  mounts: Mount[];
  close(): void;
}

/**
 * Copies the configuration files into a fresh folder readable by the sandbox uid. `sandboxed`:
 * paths in the environment are the sandbox's (/run/kiln-config/...); else the copies' own.
 */
export function stageBuildConfig(cfg: HostBuildConfig, sandboxed: boolean): StagedConfig {
  const env = { ...cfg.env };
  if (!cfg.files.length) return { env, mounts: [], close: () => {} };
  const dir = mkdtempSync(join(tmpdir(), "kiln-buildcfg-"));
  try {
    chmodSync(dir, 0o755);
    const mounts: Mount[] = [];
    for (const f of cfg.files) {
      const copy = join(dir, f.name);
      mkdirSync(dirname(copy), { recursive: true, mode: 0o755 });
      try {
        copyFileSync(f.src, copy);
      } catch {
        continue; // unreadable by Kiln too: the tool would not have read it either
      }
      chmodSync(copy, 0o444);
      if (f.env) env[f.env[0]] = join(sandboxed ? CONFIG_IN_SANDBOX : dir, f.env[1]);
      if (f.at && sandboxed) mounts.push({ kind: "bind", src: copy, dest: f.at });
    }
    if (sandboxed) mounts.unshift({ kind: "bind", src: dir, dest: CONFIG_IN_SANDBOX });
    return { env, mounts, close: () => rmSync(dir, { recursive: true, force: true }) };
  } catch (e) {
    rmSync(dir, { recursive: true, force: true });
    throw e;
  }
}
