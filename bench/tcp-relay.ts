// A bare TCP relay on Bun's sockets (Bun.listen in, Bun.connect out, bytes passed as they come, no
// parsing): the floor for any proxy written for this runtime, measured beside Kiln's wire proxy by
// bench/database-proxy.ts (PATHS=...,relay). Run: bun bench/tcp-relay.ts <listen port> <target port>
const [listenPort, targetPort] = process.argv.slice(2).map(Number);
type Side = { peer: import("bun").Socket<Side> | null; queue: Uint8Array[] };
Bun.listen<Side>({
  hostname: "127.0.0.1",
  port: listenPort!,
  socket: {
    open(client) {
      client.data = { peer: null, queue: [] };
      client.setNoDelay(true);
      void Bun.connect<Side>({
        hostname: "127.0.0.1",
        port: targetPort!,
        data: { peer: client, queue: [] },
        socket: {
          open(server) {
            server.setNoDelay(true);
            client.data.peer = server;
            for (const q of client.data.queue.splice(0)) server.write(q);
          },
          data: (server, chunk) => void server.data.peer!.write(chunk),
          close: () => void client.end(),
          error: () => void client.end(),
        },
      });
    },
    // Loopback and small messages: a partial write does not happen here (the bench checks nothing else).
    data: (client, chunk) => (client.data.peer ? void client.data.peer.write(chunk) : void client.data.queue.push(chunk)),
    close: (client) => void client.data.peer?.end(),
    error: (client) => void client.data.peer?.end(),
  },
});
console.log("listening");
