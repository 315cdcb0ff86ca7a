import type { Config } from "../config";
import type { ListeningAddress } from "../platform";

/**
 * A frontend's site is `<name>--<project-id>` under the frontends domain (one DNS label, so one
 * wildcard certificate `*.<domain>` covers every site): `http://shop--abc...xyz.app.localhost:7070`.
 * KILN_FRONTENDS_URL (`https://{site}.apps.example.com`) replaces the shown URL for a Kiln behind a
 * proxy; routing is by the label either way.
 */
export function siteLabel(f: { name: string; project_id: string }): string {
  return `${f.name}--${f.project_id}`;
}

export function siteHost(config: Pick<Config, "frontendsDomain">, f: { name: string; project_id: string }): string {
  return `${siteLabel(f)}.${config.frontendsDomain}`;
}

export function siteUrl(config: Pick<Config, "frontendsDomain" | "frontendsUrl">, address: ListeningAddress, f: { name: string; project_id: string }): string {
  if (config.frontendsUrl) return config.frontendsUrl.replace("{site}", siteLabel(f)).replace(/\/+$/, "");
  return `http://${siteHost(config, f)}:${address.httpPort()}`;
}

export function siteHttpsUrl(config: Pick<Config, "frontendsDomain">, tlsPort: number, f: { name: string; project_id: string }): string {
  return `https://${siteHost(config, f)}${tlsPort === 443 ? "" : `:${tlsPort}`}`;
}

/** The frontend a Host header addresses by its site label, or null. */
export function matchSiteHost(host: string | null, domain: string): { name: string; projectId: string } | null {
  if (!host) return null;
  const h = host.toLowerCase().replace(/:\d+$/, "").replace(/\.$/, "");
  const suffix = `.${domain}`;
  if (!h.endsWith(suffix)) return null;
  const m = /^([a-z0-9](?:[a-z0-9-]*[a-z0-9])?)--([a-z0-9]{20})$/.exec(h.slice(0, -suffix.length));
  return m ? { name: m[1]!, projectId: m[2]! } : null;
}
