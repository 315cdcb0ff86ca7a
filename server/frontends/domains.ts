import { createHash, createPrivateKey, randomBytes, X509Certificate } from "node:crypto";
import type { Clock } from "../clock";
import type { Config } from "../config";
import { badRequest, conflict, HttpError } from "../http/errors";
import type { Logger } from "../log";
import type { ListeningAddress } from "../platform";
import type { SecretKey } from "../secrets/secret-key";
import type { ControlStore } from "../store/store";
import { domainOf, type DomainRecord, type FrontendRecord } from "./records";
import type { CustomDomainBody } from "./schemas";
import { siteHost, siteHttpsUrl, siteUrl } from "./site-address";

/** The certificates the HTTPS listener presents, by SNI name; the default site certificate first. */
export interface TlsEntry {
  serverName: string;
  cert: string;
  key: string;
}

const PEM_CERT = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g;

/**
 * Checks an uploaded certificate (spec: custom domain create): it parses, the key matches it, it is
 * valid now (on the platform clock), it covers the domain, and the optional chain links each
 * certificate to the next by issuer and signature. Each failure is a 400 naming the problem.
 */
export function validateCertificate(domain: string, tls: CustomDomainBody["tls"], nowMs: number): X509Certificate {
  let cert: X509Certificate;
  try {
    const blocks = tls.certificate_pem.match(PEM_CERT);
    if (!blocks || blocks.length !== 1) throw new Error("expected one certificate");
    cert = new X509Certificate(blocks[0]!);
  } catch {
    throw badRequest("tls.certificate_pem is not a PEM certificate (one -----BEGIN CERTIFICATE----- block; put intermediates in tls.certificate_chain_pem)");
  }
  let key;
  try {
    key = createPrivateKey(tls.private_key_pem);
  } catch {
    throw badRequest("tls.private_key_pem is not a PEM private key (unencrypted PKCS#1, PKCS#8 or SEC1)");
  }
  if (!cert.checkPrivateKey(key)) throw badRequest("tls.private_key_pem does not match the certificate's public key");
  const checkDates = (c: X509Certificate, what: string) => {
    if (Date.parse(c.validTo) <= nowMs) throw badRequest(`${what} expired on ${new Date(c.validTo).toISOString()}`);
    if (Date.parse(c.validFrom) > nowMs) throw badRequest(`${what} is not valid before ${new Date(c.validFrom).toISOString()}`);
  };
  checkDates(cert, "the certificate");
  if (!cert.checkHost(domain)) throw badRequest(`the certificate does not cover ${domain} (it names: ${cert.subjectAltName ?? cert.subject.replace(/\n/g, ", ")})`);
  if (tls.certificate_chain_pem !== undefined && tls.certificate_chain_pem.trim() !== "") {
    const blocks = tls.certificate_chain_pem.match(PEM_CERT);
    if (!blocks) throw badRequest("tls.certificate_chain_pem holds no PEM certificate");
    let child = cert;
    for (const [i, b] of blocks.entries()) {
      let parent: X509Certificate;
      try {
        parent = new X509Certificate(b);
      } catch {
        throw badRequest(`tls.certificate_chain_pem: certificate ${i + 1} is not a valid PEM certificate`);
      }
      if (!child.checkIssued(parent) || !child.verify(parent.publicKey))
        throw badRequest(`the chain does not verify: ${oneLine(child.subject)} is not signed by chain certificate ${i + 1} (${oneLine(parent.subject)})`);
      checkDates(parent, `chain certificate ${i + 1} (${oneLine(parent.subject)})`);
      child = parent;
    }
  }
  return cert;
}

const oneLine = (s: string) => s.replace(/\n/g, ", ");

/**
 * Custom domains (SUPERAGENT; one per frontend): the uploaded certificate is served on Kiln's HTTPS
 * port (`--frontends-tls-port`) by SNI, beside the default site certificate from the data dir's
 * local CA. Attaching is `provisioning` until the listener presents the certificate, then `active`;
 * detaching is `detaching` until the listener dropped it, then the domain is gone. Without an HTTPS
 * port there is nowhere to serve a domain: 503, as the spec's "provisioning unavailable".
 */
export class DomainsService {
  /** Reloads the HTTPS listener with the current certificates (set by the area when it listens). */
  reload: (() => Promise<void>) | null = null;
  private chain: Promise<unknown> = Promise.resolve();

  constructor(
    private readonly d: { store: ControlStore; clock: Clock; log: Logger; config: Config; address: ListeningAddress; secretKey: SecretKey; tlsPort: () => Promise<number | null> },
  ) {}

  async record(frontendId: string): Promise<DomainRecord | null> {
    const [r] = await this.d.store.query(`select * from frontend_domains where frontend_id = $1`, [frontendId]);
    return r ? domainOf(r) : null;
  }

  async attach(f: FrontendRecord, body: CustomDomainBody): Promise<{ created: boolean; view: NonNullable<Awaited<ReturnType<DomainsService["view"]>>> }> {
    if ((await this.d.tlsPort()) === null) throw new HttpError(503, { error: "custom domain provisioning is unavailable: this Kiln has no HTTPS port (start it with --frontends-tls-port)" });
    const cert = validateCertificate(body.domain, body.tls, this.d.clock.nowMs());
    void cert;
    const at = this.d.clock.now().toISOString();
    const created = await this.d.store.transaction(async (tx) => {
      await tx.query(`select id from frontends where id = $1 for update`, [f.id]);
      const [mine] = await tx.query(`select * from frontend_domains where frontend_id = $1`, [f.id]);
      if (mine) {
        const m = domainOf(mine);
        if (m.status === "detaching") throw conflict("the previous custom domain of this frontend is still detaching");
        if (m.domain !== body.domain) throw conflict(`this frontend already has the custom domain ${m.domain} (one per frontend; delete it first)`);
        // The same domain again: its certificate is replaced (a renewal).
        await tx.query(`update frontend_domains set certificate_pem = $2, private_key_pem = $3, certificate_chain_pem = $4, updated_at = $5 where frontend_id = $1`, [
          f.id,
          body.tls.certificate_pem.trim(),
          this.d.secretKey.encrypt(body.tls.private_key_pem),
          body.tls.certificate_chain_pem?.trim() || null,
          at,
        ]);
        return false;
      }
      const [elsewhere] = await tx.query(`select frontend_id, status from frontend_domains where domain = $1`, [body.domain]);
      if (elsewhere) throw conflict(elsewhere.status === "detaching" ? `${body.domain} is still detaching from another frontend` : `${body.domain} is attached to another frontend`);
      await tx.query(
        `insert into frontend_domains (frontend_id, project_id, domain, status, verification_token, certificate_pem, private_key_pem, certificate_chain_pem, created_at, updated_at)
         values ($1, $2, $3, 'provisioning', $4, $5, $6, $7, $8, $8)`,
        [f.id, f.project_id, body.domain, randomBytes(16).toString("hex"), body.tls.certificate_pem.trim(), this.d.secretKey.encrypt(body.tls.private_key_pem), body.tls.certificate_chain_pem?.trim() || null, at],
      );
      return true;
    });
    this.apply();
    return { created, view: (await this.view(f))! };
  }

  async detach(f: FrontendRecord): Promise<void> {
    const [r] = await this.d.store.query(`update frontend_domains set status = 'detaching', updated_at = $2 where frontend_id = $1 and status <> 'detaching' returning domain`, [f.id, this.d.clock.now().toISOString()]);
    if (!r) {
      const mine = await this.record(f.id);
      if (!mine) throw new HttpError(404, { error: "no custom domain is configured for this frontend" });
    }
    this.apply();
  }

  /** Brings the listener in line with the table, then moves `provisioning` to `active` and removes `detaching` rows (serialized). */
  apply(): Promise<void> {
    const run = this.chain.then(async () => {
      try {
        await this.reload?.();
        const at = this.d.clock.now().toISOString();
        await this.d.store.query(`update frontend_domains set status = 'active', updated_at = $1 where status = 'provisioning'`, [at]);
        await this.d.store.query(`delete from frontend_domains where status = 'detaching'`);
      } catch (err) {
        this.d.log.error("custom domains: the HTTPS listener could not be updated", err);
        await this.d.store.query(`update frontend_domains set status = 'failed' where status = 'provisioning'`).catch(() => {});
      }
    });
    this.chain = run;
    return run;
  }

  /** The SNI certificates of every attached domain (their keys decrypted). */
  async tlsEntries(): Promise<TlsEntry[]> {
    const rows = await this.d.store.query(`select * from frontend_domains where status in ('provisioning', 'active')`);
    return rows.map((r) => {
      const d = domainOf(r);
      return { serverName: d.domain, cert: `${d.certificate_pem}\n${d.certificate_chain_pem ?? ""}`.trim() + "\n", key: this.d.secretKey.decrypt(d.private_key_pem) };
    });
  }

  /** Domain → frontend, for routing requests that arrive by a custom domain's name. */
  async routes(): Promise<Map<string, string>> {
    const rows = await this.d.store.query(`select domain, frontend_id from frontend_domains where status in ('provisioning', 'active')`);
    return new Map(rows.map((r) => [r.domain as string, r.frontend_id as string]));
  }

  async view(f: FrontendRecord) {
    const d = await this.record(f.id);
    if (!d) return null;
    const cert = new X509Certificate(d.certificate_pem);
    const port = await this.d.tlsPort();
    const effective = [siteUrl(this.d.config, this.d.address, f)];
    if (d.status === "active" && port !== null) effective.push(`https://${d.domain}${port === 443 ? "" : `:${port}`}`);
    if (port !== null) effective.splice(1, 0, siteHttpsUrl(this.d.config, port, f));
    return {
      domain: d.domain,
      domain_status: d.status,
      tls_mode: "byoc" as const,
      // Locally nothing sits between a name and Kiln: a name pointed here is served, so it counts as verified.
      verification_status: "verified" as const,
      verification_records: [{ type: "TXT" as const, name: `_kiln-verification.${d.domain}`, value: `kiln-verification=${d.verification_token}` }],
      required_routing_record: { type: "CNAME" as const, name: d.domain, value: siteHost(this.d.config, f) },
      effective_urls: effective,
      certificate: {
        subject: oneLine(cert.subject),
        issuer: oneLine(cert.issuer),
        not_after: new Date(cert.validTo).toISOString(),
        fingerprint_sha256: createHash("sha256").update(cert.raw).digest("hex"),
      },
      created_at: d.created_at,
      updated_at: d.updated_at,
    };
  }
}
