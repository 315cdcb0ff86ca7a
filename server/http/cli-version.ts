/** `X-Service-CLI-Version` handling: a CLI below the minimum gets 426, one below the latest a hint. */
export function parseVersion(v: string): number[] | null {
  const m = /^v?(\d+)\.(\d+)\.(\d+)/.exec(v.trim());
  return m ? [Number(m[1]), Number(m[2]), Number(m[3])] : null;
}

export function compareVersions(a: number[], b: number[]): number {
  for (let i = 0; i < 3; i++) if (a[i] !== b[i]) return a[i]! < b[i]! ? -1 : 1;
  return 0;
}

export type CliVerdict = "ok" | "suggest_upgrade" | "require_upgrade";

export function judgeCliVersion(header: string | null, latest: string, minimum?: string): CliVerdict {
  if (!header) return "ok";
  const v = parseVersion(header);
  if (!v) return "ok";
  const min = minimum ? parseVersion(minimum) : null;
  if (min && compareVersions(v, min) < 0) return "require_upgrade";
  const lat = parseVersion(latest);
  if (lat && compareVersions(v, lat) < 0) return "suggest_upgrade";
  return "ok";
}
