// Kiln's build egress forwarder: runs inside the build sandbox (own network namespace, only a
// private loopback) in front of a dependency installer.
//
//   bun build-egress-forwarder.mjs <socketPath> -- <installer argv...>
//
// Listens on 127.0.0.1:<free port> of the sandbox's loopback and pipes every TCP connection to the
// unix socket <socketPath>, where Kiln's build egress proxy (runtime-sandbox/build-egress.ts)
// decides what may be reached. Then runs the installer with the proxy environment pointing at that
// port, stdio inherited, signals forwarded, and exits with its exit code (128 + signal number when
// a signal ended it). Plain JavaScript on node: APIs, so it runs under Bun and Node alike.
import { spawn } from "node:child_process";
import net from "node:net";
import { constants } from "node:os";

const args = process.argv.slice(2);
const sep = args.indexOf("--");
const socketPath = args[0];
const argv = sep >= 0 ? args.slice(sep + 1) : [];
if (sep !== 1 || !socketPath || argv.length === 0) {
  process.stderr.write("usage: build-egress-forwarder.mjs <socketPath> -- <installer argv...>\n");
  process.exit(2);
}

const server = net.createServer((client) => {
  const upstream = net.createConnection(socketPath);
  const close = () => {
    client.destroy();
    upstream.destroy();
  };
  client.on("error", close);
  upstream.on("error", (e) => {
    if (e && e.code !== "ECONNRESET" && e.code !== "EPIPE") process.stderr.write(`kiln build egress: ${socketPath}: ${e.message}\n`);
    close();
  });
  client.on("close", close);
  upstream.on("close", close);
  client.pipe(upstream);
  upstream.pipe(client);
});
server.on("error", (e) => {
  process.stderr.write(`kiln build egress: cannot listen on the sandbox's loopback: ${e.message}\n`);
  process.exit(125);
});

server.listen(0, "127.0.0.1", () => {
  const proxy = `http://127.0.0.1:${server.address().port}`;
  const env = { ...process.env };
  for (const k of ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "npm_config_proxy", "npm_config_https_proxy", "PIP_PROXY"]) env[k] = proxy;
  // Nothing bypasses the proxy: there is no other way out of the sandbox anyway.
  for (const k of ["NO_PROXY", "no_proxy", "npm_config_noproxy", "ALL_PROXY", "all_proxy"]) env[k] = "";
  for (const k of Object.keys(env)) if (/^(npm_config_(https_)?proxy|npm_config_noproxy)$/i.test(k) && k !== k.toLowerCase()) delete env[k];

  const child = spawn(argv[0], argv.slice(1), { env, stdio: "inherit" });
  const forward = (sig) => {
    try {
      child.kill(sig);
    } catch {
      // already gone
    }
  };
  for (const sig of ["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"]) process.on(sig, () => forward(sig));
  child.on("error", (e) => {
    process.stderr.write(`${argv[0]}: ${e.message}\n`);
    process.exit(e.code === "ENOENT" ? 127 : 126);
  });
  child.on("exit", (code, signal) => {
    server.close();
    process.exit(code ?? 128 + (constants.signals[signal] ?? 0));
  });
});
