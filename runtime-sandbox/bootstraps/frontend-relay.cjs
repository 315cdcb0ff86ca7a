// Kiln's frontend relay: preloaded (`node --require`) into a Next.js standalone server that runs in
// a network namespace of its own (only a private loopback inside). It is the server's only way to
// and from the outside, each a unix socket in a folder Kiln bind-mounts in:
//
//   - in:     <app socket> (made here, once the app listens)  ->  127.0.0.1:<app port>
//             Kiln proxies every site request to this socket.
//   - Kiln:   127.0.0.1:<kiln port> and [::1]:<kiln port>     ->  <kiln socket>
//             Kiln's own HTTP port appears at the same number inside, so a server component calls
//             a Kiln function (`invoke_url`) or the public URL unchanged.
//   - egress: 127.0.0.1:<proxy port>                          ->  <egress socket>
//             Kiln's egress proxy (runtime-sandbox/build-egress.ts) for everything else: Node's
//             fetch goes through it (HTTP(S)_PROXY with NODE_USE_ENV_PROXY=1, set by Kiln); it
//             refuses loopback and private addresses.
//
// Nothing else is reachable: another host service on loopback (Kiln's PostgreSQL wire port, say)
// simply does not exist in this namespace. The configuration comes in KILN_RELAY (JSON), removed
// from the environment before any app code runs. Plain CommonJS on node: APIs.
"use strict";
const net = require("node:net");
const fs = require("node:fs");

const raw = process.env.KILN_RELAY;
delete process.env.KILN_RELAY;
if (raw) start(JSON.parse(raw));

function pipe(client, connectTo) {
  const upstream = net.createConnection(connectTo);
  const close = () => {
    client.destroy();
    upstream.destroy();
  };
  client.on("error", close);
  upstream.on("error", close);
  client.on("close", close);
  upstream.on("close", close);
  client.pipe(upstream);
  upstream.pipe(client);
}

function relay(listenOn, connectTo, required) {
  const server = net.createServer((c) => pipe(c, connectTo));
  server.on("error", (e) => {
    if (required) {
      process.stderr.write(`kiln frontend relay: cannot listen on ${JSON.stringify(listenOn)}: ${e.message}\n`);
      process.exit(125);
    }
  });
  server.listen(listenOn);
  // The relay never keeps the server alive on its own.
  server.unref();
  return server;
}

function start(cfg) {
  if (cfg.kilnPort) for (const host of ["127.0.0.1", "::1"]) relay({ host, port: cfg.kilnPort }, cfg.kilnSocket, host === "127.0.0.1");
  relay({ host: "127.0.0.1", port: cfg.proxyPort }, cfg.egressSocket, true);
  // The inbound socket appears once the app accepts connections, so Kiln's first request never
  // meets a relay with nothing behind it.
  const poll = () => {
    const probe = net.createConnection({ host: "127.0.0.1", port: cfg.appPort });
    probe.on("connect", () => {
      probe.destroy();
      try {
        fs.rmSync(cfg.appSocket, { force: true });
      } catch {
        // not there
      }
      relay(cfg.appSocket, { host: "127.0.0.1", port: cfg.appPort }, true);
    });
    probe.on("error", () => setTimeout(poll, 20).unref());
  };
  poll();
}
