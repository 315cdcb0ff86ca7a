// Throwaway S3 server for tests: Ceph's RADOS Gateway (radosgw, Debian's `radosgw`) over a one-node
// Ceph cluster (one monitor, one OSD on memstore: objects live in the OSD's memory), everything under
// a temp dir and on loopback ports, up in about a second. Uses only node: APIs so it runs under both
// Bun and Node 20, as any user (root included: the daemons then run as root). See docs/storage.md
// ("The S3 backend and its test server") for why radosgw.
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { randomBytes, randomUUID } from "node:crypto";
import { accessSync, constants, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { request } from "node:http";
import { tmpdir } from "node:os";
import { delimiter, join } from "node:path";
import { freePort } from "./free-port";

export interface S3Server {
  /** http://127.0.0.1:PORT */
  endPoint: string;
  accessKey: string;
  secretKey: string;
  region: string;
  stop(): Promise<void>;
}

const TOOLS = ["monmaptool", "ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph"] as const;
type Tool = (typeof TOOLS)[number];

/** Paths of the Ceph programs, from PATH (then /usr/bin, /usr/sbin); null when one is missing. */
export function findCephTools(): Record<Tool, string> | null {
  const dirs = [...(process.env.PATH ?? "").split(delimiter), "/usr/bin", "/usr/sbin"].filter(Boolean);
  const found = {} as Record<Tool, string>;
  for (const tool of TOOLS) {
    const hit = dirs.map((d) => join(d, tool)).find((p) => {
      try {
        accessSync(p, constants.X_OK);
        return true;
      } catch {
        return false;
      }
    });
    if (!hit) return null;
    found[tool] = hit;
  }
  return found;
}


function run(file: string, args: string[], cwd: string, timeout = 30_000): Promise<string> {
  return new Promise((resolve, reject) =>
    execFile(file, args, { cwd, timeout }, (err, stdout, stderr) =>
      err ? reject(new Error(`${file} ${args.slice(0, 3).join(" ")} failed (${err.code ?? err.signal}): ${stderr || stdout}`)) : resolve(stdout),
    ),
  );
}

/** GET / answers (anonymous ListAllMyBuckets): the gateway is serving. */
function answers(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const req = request({ host: "127.0.0.1", port, path: "/", timeout: 1_000 }, (res) => {
      res.resume();
      resolve(res.statusCode !== undefined && res.statusCode < 500);
    });
    req.on("error", () => resolve(false));
    req.on("timeout", () => req.destroy());
    req.end();
  });
}

export async function startS3Server(): Promise<S3Server> {
  const tools = findCephTools();
  if (!tools) throw new Error(`the S3 test server needs Ceph's ${TOOLS.join(", ")} (apt-get install radosgw ceph-mon ceph-osd)`);

  const dir = mkdtempSync(join(tmpdir(), "kiln-s3-"));
  for (const d of ["run", "log", "mon", "osd0", "rgw"]) mkdirSync(join(dir, d));
  const conf = join(dir, "ceph.conf");
  const [monPort, rgwPort] = [await freePort(), await freePort()];
  const fsid = randomUUID();
  const accessKey = `kiln${randomBytes(8).toString("hex")}`;
  const secretKey = randomBytes(24).toString("hex");
  writeFileSync(
    conf,
    [
      "[global]",
      `fsid = ${fsid}`,
      `mon host = [v2:127.0.0.1:${monPort}]`,
      "public addr = 127.0.0.1",
      "ms bind ipv6 = false",
      // No cephx: nothing but this process's daemons listen, on loopback. Secure messenger mode needs
      // cephx, so every messenger uses crc.
      "auth cluster required = none",
      "auth service required = none",
      "auth client required = none",
      "ms mon client mode = crc",
      "ms client mode = crc",
      "ms service mode = crc",
      "ms cluster mode = crc",
      "ms mon service mode = crc",
      "ms mon cluster mode = crc",
      `run dir = ${dir}/run`,
      `admin socket = ${dir}/run/$name.asok`,
      `log file = ${dir}/log/$name.log`,
      `mon cluster log file = ${dir}/log/$cluster.$channel.log`,
      `pid file = ${dir}/run/$name.pid`,
      // One OSD: pools of one replica, one placement group each.
      "osd pool default size = 1",
      "osd pool default min size = 1",
      "mon allow pool size one = true",
      "mon allow pool delete = true",
      "osd pool default pg autoscale mode = off",
      "osd pool default pg num = 1",
      "osd pool default pgp num = 1",
      "osd crush chooseleaf type = 0",
      "mon data avail warn = 1",
      "mon data avail crit = 1",
      "osd objectstore = memstore",
      "memstore device bytes = 8589934592",
      `osd data = ${dir}/osd$id`,
      "client mount timeout = 30",
      "rados osd op timeout = 60",
      "[mon]",
      `mon data = ${dir}/mon`,
      // The gateway's first start creates a dozen pools, one map epoch each: the default 1 s between
      // Paxos proposals makes that 10 s, this makes it a few hundred ms.
      "paxos propose interval = 0.01",
      "paxos min wait = 0.001",
      "[client.rgw]",
      `rgw frontends = beast endpoint=127.0.0.1:${rgwPort}`,
      `rgw data = ${dir}/rgw`,
      "",
    ].join("\n"),
  );

  const children: ChildProcess[] = [];
  const daemon = (tool: Tool, args: string[]) => {
    const child = spawn(tools[tool], ["-f", "-c", conf, ...args], { cwd: dir, stdio: "ignore" });
    child.on("error", () => {});
    children.push(child);
    return child;
  };

  let stopped = false;
  const stopSync = () => {
    if (stopped) return;
    stopped = true;
    process.removeListener("exit", stopSync);
    for (const s of signals) process.removeListener(s, onSignal);
    // The data is disposable: no orderly shutdown (memstore would write every object to disk first).
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
  };
  const signals = ["SIGINT", "SIGTERM", "SIGHUP"] as const;
  const onSignal = (sig: NodeJS.Signals) => {
    stopSync();
    if (process.listenerCount(sig) === 0) process.kill(process.pid, sig);
  };
  process.on("exit", stopSync);
  for (const s of signals) process.once(s, onSignal);

  try {
    const ceph = (args: string[]) => run(tools.ceph, ["-c", conf, "--connect-timeout", "20", ...args], dir);
    await run(tools.monmaptool, ["--create", "--addv", "a", `[v2:127.0.0.1:${monPort}]`, "--fsid", fsid, join(dir, "monmap")], dir);
    await run(tools["ceph-mon"], ["-c", conf, "--mkfs", "-i", "a", "--monmap", join(dir, "monmap")], dir);
    daemon("ceph-mon", ["-i", "a"]);
    const id = (await ceph(["osd", "create"])).trim();
    await run(tools["ceph-osd"], ["-c", conf, "-i", id, "--mkfs"], dir);
    daemon("ceph-osd", ["-i", id]);
    // The user first, then the gateway: made while the gateway starts, the user's creation sometimes
    // waited 5 s on a notification to the half-started gateway.
    await run(tools["radosgw-admin"], ["-c", conf, "user", "create", "--uid", "kiln", "--display-name", "kiln", "--access-key", accessKey, "--secret", secretKey], dir, 60_000);
    daemon("radosgw", ["-n", "client.rgw"]);
    const deadline = Date.now() + 60_000;
    while (!(await answers(rgwPort))) {
      const dead = children.find((c) => c.exitCode !== null || c.signalCode !== null);
      if (dead) throw new Error(`${dead.spawnfile} exited (${dead.exitCode ?? dead.signalCode})`);
      if (Date.now() > deadline) throw new Error("radosgw did not answer within 60 s");
      await new Promise((r) => setTimeout(r, 50));
    }
   
    return {
      endPoint: `http://127.0.0.1:${rgwPort}`,
      accessKey,
      secretKey,
      region: "us-east-1",
      stop: async () => {
        const exited = children.map((c) => (c.exitCode !== null || c.signalCode !== null ? Promise.resolve() : new Promise<void>((r) => c.once("exit", () => r()))));
        stopSync();
        await Promise.all(exited);
      },
    };
  } catch (e) {
    let tail = "";
    for (const name of ["mon.a", "osd.0", "client.rgw"]) {
      try {
        tail += `--- ${name} log tail ---\n${readFileSync(join(dir, "log", `${name}.log`), "utf8").split("\n").slice(-15).join("\n")}\n`;
      } catch {}
    }
    stopSync();
    throw new Error(`failed to start the S3 test server (radosgw): ${(e as Error).message}\n${tail}`);
  }
}
