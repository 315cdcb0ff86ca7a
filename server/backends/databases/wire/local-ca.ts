import { generateKeyPair, type KeyObject } from "node:crypto";
import { mkdir, readFile, rename, writeFile } from "node:fs/promises";
import { isIP } from "node:net";
import { join } from "node:path";
import { promisify } from "node:util";
import forge from "node-forge";

/**
 * The wire listener's TLS material: a certificate authority made once per data dir and a server
 * certificate it signs for the listener's names and addresses, so clients can use `sslmode=require`
 * and `verify-full` with `sslrootcert=<dir>/ca.pem`. node:crypto makes the keys; node-forge builds
 * the X.509 certificates (node:crypto has none). Only the CA's certificate is public; keys are 0600.
 * Validity is wall time on purpose: clients check certificates against their own clocks.
 */
export interface WireTlsMaterial {
  /** Where the CA certificate lives (what users pass as sslrootcert). */
  caPath: string;
  caPem: string;
  /** The server certificate followed by the CA's, and its key: what the TLS server presents. */
  cert: string;
  key: string;
  /** The names and addresses the server certificate is valid for. */
  hosts: string[];
}

const generate = promisify(generateKeyPair);
const DAY = 86_400_000;
const CA_DAYS = 3650;
/** Apple's platforms refuse server certificates valid for longer than 825 days. */
const SERVER_DAYS = 825;
/** A server certificate this close to its end is made anew at start. */
const RENEW_BEFORE_DAYS = 30;

interface Files {
  ca: string;
  caKey: string;
  server: string;
  serverKey: string;
  hosts: string;
}

/** The CA and server certificate under `dir`, made or remade as needed (a new host list remakes the server certificate only). */
export async function localWireTls(dir: string, wantedHosts: string[]): Promise<WireTlsMaterial> {
  const hosts = [...new Set(wantedHosts.map((h) => h.trim().replace(/^\[|\]$/g, "")).filter((h) => h && h !== "0.0.0.0" && h !== "::"))].sort();
  const f: Files = {
    ca: join(dir, "ca.pem"),
    caKey: join(dir, "ca-key.pem"),
    server: join(dir, "server.pem"),
    serverKey: join(dir, "server-key.pem"),
    hosts: join(dir, "server-hosts.json"),
  };
  await mkdir(dir, { recursive: true, mode: 0o700 });

  const ca = await ensureCa(f.ca, f.caKey);
  let server = await readPair(f.server, f.serverKey);
  const recorded = await readFile(f.hosts, "utf8").catch(() => "");
  const stale =
    !server ||
    recorded !== JSON.stringify(hosts) ||
    server.cert.validity.notAfter.getTime() < Date.now() + RENEW_BEFORE_DAYS * DAY ||
    !ca.cert.verify(server.cert);
  if (stale) {
    server = await makeServer(ca, hosts);
    await writeAtomic(f.serverKey, server.keyPem, 0o600);
    await writeAtomic(f.server, forge.pki.certificateToPem(server.cert), 0o644);
    await writeAtomic(f.hosts, JSON.stringify(hosts), 0o644);
  }
  const caPem = forge.pki.certificateToPem(ca.cert);
  return { caPath: f.ca, caPem, cert: forge.pki.certificateToPem(server!.cert) + caPem, key: server!.keyPem, hosts };
}

/**
 * A server certificate for other listeners of this Kiln (frontends' HTTPS port), signed by the same
 * local CA as the wire listener's (one CA per data dir to trust): `<dir>/<name>.pem` and its key,
 * remade when the host list changes or it nears its end. Wildcards (`*.app.localhost`) are allowed.
 */
export async function localServerCertificate(dir: string, name: string, wantedHosts: string[]): Promise<WireTlsMaterial> {
  const hosts = [...new Set(wantedHosts.map((h) => h.trim()).filter(Boolean))].sort();
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const ca = await ensureCa(join(dir, "ca.pem"), join(dir, "ca-key.pem"));
  const certPath = join(dir, `${name}.pem`);
  const keyPath = join(dir, `${name}-key.pem`);
  const hostsPath = join(dir, `${name}-hosts.json`);
  let server = await readPair(certPath, keyPath);
  const recorded = await readFile(hostsPath, "utf8").catch(() => "");
  if (!server || recorded !== JSON.stringify(hosts) || server.cert.validity.notAfter.getTime() < Date.now() + RENEW_BEFORE_DAYS * DAY || !ca.cert.verify(server.cert)) {
    server = await makeServer(ca, hosts);
    await writeAtomic(keyPath, server.keyPem, 0o600);
    await writeAtomic(certPath, forge.pki.certificateToPem(server.cert), 0o644);
    await writeAtomic(hostsPath, JSON.stringify(hosts), 0o644);
  }
  const caPem = forge.pki.certificateToPem(ca.cert);
  return { caPath: join(dir, "ca.pem"), caPem, cert: forge.pki.certificateToPem(server.cert) + caPem, key: server.keyPem, hosts };
}

/** The data dir's CA, made when missing or near its end. */
async function ensureCa(certPath: string, keyPath: string): Promise<Pair> {
  let ca = await readPair(certPath, keyPath);
  if (!ca || ca.cert.validity.notAfter.getTime() < Date.now() + DAY) {
    ca = await makeCa();
    await writeAtomic(keyPath, ca.keyPem, 0o600);
    await writeAtomic(certPath, forge.pki.certificateToPem(ca.cert), 0o644);
  }
  return ca;
}

interface Pair {
  cert: forge.pki.Certificate;
  key: forge.pki.rsa.PrivateKey;
  keyPem: string;
}

async function readPair(certPath: string, keyPath: string): Promise<Pair | null> {
  try {
    const [certPem, keyPem] = await Promise.all([readFile(certPath, "utf8"), readFile(keyPath, "utf8")]);
    return { cert: forge.pki.certificateFromPem(certPem), key: forge.pki.privateKeyFromPem(keyPem) as forge.pki.rsa.PrivateKey, keyPem };
  } catch {
    return null; // missing or unreadable: made anew
  }
}

async function rsaKeys(): Promise<{ key: forge.pki.rsa.PrivateKey; publicKey: forge.pki.rsa.PublicKey; keyPem: string }> {
  // On libuv's thread pool: 2048-bit RSA takes 50-300 ms, which would stall the event loop.
  const { privateKey, publicKey } = (await generate("rsa", { modulusLength: 2048 })) as { privateKey: KeyObject; publicKey: KeyObject };
  const keyPem = privateKey.export({ type: "pkcs1", format: "pem" }) as string;
  return {
    key: forge.pki.privateKeyFromPem(keyPem) as forge.pki.rsa.PrivateKey,
    publicKey: forge.pki.publicKeyFromPem(publicKey.export({ type: "spki", format: "pem" }) as string) as forge.pki.rsa.PublicKey,
    keyPem,
  };
}

function serial(): string {
  // Positive, 16 random bytes: what RFC 5280 asks of a serial number.
  return "01" + forge.util.bytesToHex(forge.random.getBytesSync(15));
}

async function makeCa(): Promise<Pair> {
  const k = await rsaKeys();
  const cert = forge.pki.createCertificate();
  cert.publicKey = k.publicKey;
  cert.serialNumber = serial();
  cert.validity.notBefore = new Date(Date.now() - DAY); // a client whose clock is a little behind
  cert.validity.notAfter = new Date(Date.now() + CA_DAYS * DAY);
  const name = [
    { name: "commonName", value: "Kiln local CA" },
    { name: "organizationName", value: "Kiln (local development)" },
  ];
  cert.setSubject(name);
  cert.setIssuer(name);
  cert.setExtensions([
    { name: "basicConstraints", cA: true, pathLenConstraint: 0, critical: true },
    { name: "keyUsage", keyCertSign: true, cRLSign: true, critical: true },
    { name: "subjectKeyIdentifier" },
  ]);
  cert.sign(k.key, forge.md.sha256.create());
  return { cert, key: k.key, keyPem: k.keyPem };
}

async function makeServer(ca: Pair, hosts: string[]): Promise<Pair> {
  const k = await rsaKeys();
  const cert = forge.pki.createCertificate();
  cert.publicKey = k.publicKey;
  cert.serialNumber = serial();
  cert.validity.notBefore = new Date(Date.now() - DAY);
  cert.validity.notAfter = new Date(Math.min(Date.now() + SERVER_DAYS * DAY, ca.cert.validity.notAfter.getTime()));
  cert.setSubject([{ name: "commonName", value: hosts.find((h) => !isIP(h)) ?? hosts[0] ?? "localhost" }]);
  cert.setIssuer(ca.cert.subject.attributes);
  cert.setExtensions([
    { name: "basicConstraints", cA: false, critical: true },
    { name: "keyUsage", digitalSignature: true, keyEncipherment: true, critical: true },
    { name: "extKeyUsage", serverAuth: true },
    // verify-full checks these: DNS names (type 2) and IP addresses (type 7).
    { name: "subjectAltName", altNames: hosts.map((h) => (isIP(h) ? { type: 7, ip: h } : { type: 2, value: h })) },
    { name: "subjectKeyIdentifier" },
    { name: "authorityKeyIdentifier", keyIdentifier: ca.cert.generateSubjectKeyIdentifier().getBytes() },
  ]);
  cert.sign(ca.key, forge.md.sha256.create());
  return { cert, key: k.key, keyPem: k.keyPem };
}

async function writeAtomic(path: string, text: string, mode: number): Promise<void> {
  const tmp = `${path}.${process.pid}.tmp`;
  await writeFile(tmp, text, { mode });
  await rename(tmp, path);
}
