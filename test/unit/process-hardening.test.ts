// Kiln's own process is not dumpable: another process of the same uid (function code run without a
// sandbox, anything else the user runs) cannot read its environment (KILN_PLATFORM_TOKEN) through
// /proc. Run as an unprivileged uid, since root reads every /proc entry regardless.
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { describe, expect, test } from "vitest";

const ROOT = join(import.meta.dirname, "../..");
const BUN = join(ROOT, "node_modules/.bin/bun");
const asUser = process.getuid?.() === 0 ? ["setpriv", "--reuid=1001", "--regid=1001", "--clear-groups", "--"] : [];

function readOwnEnvironFromSibling(hide: boolean): string {
  const script = `
    const { hideOwnProcEntries } = await import(${JSON.stringify(join(ROOT, "runtime-sandbox/isolation.ts"))});
    if (${hide} && !hideOwnProcEntries()) throw new Error("prctl failed");
    const r = Bun.spawnSync(["/bin/sh", "-c", "cat /proc/" + process.pid + "/environ >/dev/null && echo readable || echo refused"]);
    console.log(r.stdout.toString().trim());`;
  const r = spawnSync(asUser[0] ?? BUN, [...asUser.slice(1), ...(asUser.length ? [BUN] : []), "-e", script], {
    cwd: "/",
    encoding: "utf8",
    env: { PATH: "/usr/bin:/bin", KILN_PLATFORM_TOKEN: "pk-secret-secret-secret" },
  });
  if (r.status !== 0) throw new Error(r.stderr);
  return r.stdout.trim();
}

describe.skipIf(process.platform !== "linux")("process hardening", () => {
  test("a same-uid process reads a normal process's environment, but not Kiln's once it hid its entries", () => {
    expect(readOwnEnvironFromSibling(false)).toBe("readable");
    expect(readOwnEnvironFromSibling(true)).toBe("refused");
  });
});
