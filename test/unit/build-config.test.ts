// The host's package-manager configuration as builds get it (build-config.ts), and the cause a
// failed install is given (install-failure.ts).
import { mkdirSync, mkdtempSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { CONFIG_IN_SANDBOX, hostBuildConfig, stageBuildConfig } from "../../runtime-sandbox/build-config";
import { diagnoseInstall } from "../../runtime-sandbox/install-failure";
import { removeDir } from "../support/dirs";

const home = mkdtempSync(join(tmpdir(), "kiln-buildcfg-home-"));
afterAll(() => removeDir(home));

describe("hostBuildConfig", () => {
  mkdirSync(join(home, ".config", "pip"), { recursive: true });
  mkdirSync(join(home, "wheels"));
  writeFileSync(join(home, ".npmrc"), `registry=http://127.0.0.1:4873/\n@corp:registry = "https://npm.corp.example/"\nhttps-proxy=http://proxy.corp:3128\nnoproxy=.corp.example\ncafile=${join(home, ".npmrc")}\n`);
  writeFileSync(join(home, ".config", "pip", "pip.conf"), `[global]\nindex-url = https://pypi.corp.example/simple\nextra-index-url =\n    http://10.0.0.5:8080/simple\n    file://${join(home, "wheels")}\nproxy = http://pipproxy:1\n`);

  test("files: npm's and pip's user configs, the registries and paths they name, their proxy", () => {
    const c = hostBuildConfig({ PATH: "/usr/bin", npm_config_registry: "http://mirror.local:8081/", npm_config_proxy: "http://x:1", PIP_TARGET: "/x" }, home);
    expect(c.files.map((f) => f.name)).toEqual(expect.arrayContaining(["npmrc", "xdg/pip/pip.conf"]));
    expect(c.registryHosts.sort()).toEqual(["10.0.0.5:8080", "127.0.0.1:4873", "mirror.local:8081", "npm.corp.example:443", "pypi.corp.example:443"]);
    // Registry settings pass; proxies, install targets and everything else do not.
    expect(c.env).toEqual({ npm_config_registry: "http://mirror.local:8081/" });
    expect(c.readOnly).toEqual(expect.arrayContaining([join(home, "wheels"), join(home, ".npmrc")]));
    expect(c.upstreamProxy).toBe("http://proxy.corp:3128");
    expect(c.noProxy).toBe(".corp.example");
  });

  test("the environment's proxy wins over the files'; NPM_CONFIG_USERCONFIG and PIP_CONFIG_FILE name other files", () => {
    const npmrc = join(home, "other-npmrc");
    writeFileSync(npmrc, "registry=http://other:1/\n");
    const pip = join(home, "other-pip.conf");
    writeFileSync(pip, "[install]\nindex-url=http://pipother:2/simple\n");
    const c = hostBuildConfig({ HTTPS_PROXY: "http://envproxy:8080", NO_PROXY: "localhost", NPM_CONFIG_USERCONFIG: npmrc, PIP_CONFIG_FILE: pip }, home);
    expect(c.files.find((f) => f.name === "npmrc")?.src).toBe(npmrc);
    expect(c.files.find((f) => f.name === "pip.conf")?.src).toBe(pip);
    expect(c.registryHosts).toEqual(expect.arrayContaining(["other:1", "pipother:2"]));
    expect(c.upstreamProxy).toBe("http://envproxy:8080");
    expect(c.noProxy).toBe("localhost");
  });

  test("staged: copies readable by anyone, the variables pointing at them inside the sandbox or on the host", () => {
    const c = hostBuildConfig({}, home);
    const inside = stageBuildConfig(c, true);
    try {
      expect(inside.env.npm_config_userconfig).toBe(`${CONFIG_IN_SANDBOX}/npmrc`);
      expect(inside.env.XDG_CONFIG_HOME).toBe(`${CONFIG_IN_SANDBOX}/xdg`);
      const dir = inside.mounts.find((m) => m.dest === CONFIG_IN_SANDBOX);
      expect(dir?.kind).toBe("bind");
      const copy = join((dir as { src: string }).src, "npmrc");
      expect(readFileSync(copy, "utf8")).toContain("registry=http://127.0.0.1:4873/");
      expect(statSync(copy).mode & 0o777).toBe(0o444);
    } finally {
      inside.close();
    }
    const host = stageBuildConfig(c, false);
    try {
      expect(host.mounts).toEqual([]);
      expect(readFileSync(host.env.npm_config_userconfig!, "utf8")).toContain("registry=");
    } finally {
      host.close();
    }
  });
});

describe("diagnoseInstall", () => {
  test("what the egress saw decides first: pip's 'No matching distribution' after an unresolvable index is network", () => {
    const lines = ["ERROR: Could not find a version that satisfies the requirement requests (from versions: none)", "ERROR: No matching distribution found for requests"];
    expect(diagnoseInstall(lines, ["build egress: CONNECT pypi.corp:443: cannot resolve pypi.corp: getaddrinfo ENOTFOUND pypi.corp"])).toEqual({ cause: "network", evidence: "CONNECT pypi.corp:443: cannot resolve pypi.corp: getaddrinfo ENOTFOUND pypi.corp" });
    expect(diagnoseInstall(lines, [])?.cause).toBe("resolution");
  });

  test("the installers' own words", () => {
    expect(diagnoseInstall(["npm error code E404", "npm error 404 Not Found - GET http://r/absent - Not found"], [])?.cause).toBe("resolution");
    expect(diagnoseInstall(["npm error code ETARGET", "npm error notarget No matching version found for x@^9.0.0."], [])?.cause).toBe("resolution");
    expect(diagnoseInstall(["npm error code ECONNREFUSED", "npm error errno ECONNREFUSED"], [])?.cause).toBe("network");
    expect(diagnoseInstall(["WARNING: Retrying (Retry(total=0)) after connection broken by 'NewConnectionError(...: Failed to establish a new connection: [Errno -3] Temporary failure in name resolution')'", "ERROR: No matching distribution found for x"], [])?.cause).toBe("network");
    expect(diagnoseInstall(["gyp ERR! build error", "npm error code 1"], [])?.cause).toBe("compile");
    expect(diagnoseInstall(["  error: subprocess-exited-with-error", "  ERROR: Failed building wheel for lxml"], [])?.cause).toBe("compile");
    expect(diagnoseInstall(["Could not find gem 'nope' in rubygems repository https://rubygems.org/ or installed locally."], [])?.cause).toBe("resolution");
    expect(diagnoseInstall(["ERROR: Could not open requirements file: [Errno 2] No such file or directory: 'x'"], [])).toBeNull();
  });
});
