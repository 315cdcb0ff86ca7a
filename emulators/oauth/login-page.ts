import type { TestIdentity } from "./api";

const LABELS: Record<string, string> = { google: "Google", microsoft: "Microsoft", apple: "Apple", github: "GitHub" };

export function providerLabel(kind: string): string {
  return LABELS[kind] ?? kind;
}

export function escapeHtml(s: string): string {
  return s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function hidden(fields: Record<string, string>): string {
  return Object.entries(fields)
    .map(([k, v]) => `<input type="hidden" name="${escapeHtml(k)}" value="${escapeHtml(v)}">`)
    .join("");
}

export interface LoginPageInput {
  kind: string;
  clientId: string;
  scopes: string[];
  identities: TestIdentity[];
  /** POST target of both forms: `identity` (an id) or the typed fields. */
  loginAction: string;
  denyAction: string;
  /** Carried by every form (GitHub's authorize parameters; nothing for the OIDC providers, whose cookie carries them). */
  fields?: Record<string, string>;
  loginHint?: string;
  error?: string;
}

/**
 * The provider's sign-in page: pick an identity, type a new one, or deny. Plain forms, no script,
 * so a person, a headless browser and a test following links all drive it the same way.
 */
export function renderLoginPage(p: LoginPageInput): string {
  const label = providerLabel(p.kind);
  const keep = hidden(p.fields ?? {});
  const people = p.identities.length
    ? p.identities
        .map(
          (i) => `<li><form method="post" action="${escapeHtml(p.loginAction)}">${keep}<input type="hidden" name="identity" value="${escapeHtml(i.id)}">
<button type="submit" data-email="${escapeHtml(i.email)}">${i.picture ? `<img src="${escapeHtml(i.picture)}" alt="" width="24" height="24"> ` : ""}<b>${escapeHtml(i.name)}</b> &lt;${escapeHtml(i.email)}&gt;${i.email_verified ? "" : " (unverified)"}</button></form></li>`,
        )
        .join("\n")
    : "<li><i>no test identities yet: type one below</i></li>";
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sign in with ${label} (Kiln emulator)</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{font:15px system-ui,sans-serif;max-width:36rem;margin:2rem auto;padding:0 1rem}ul{list-style:none;padding:0}li{margin:.4rem 0}
button{font:inherit;padding:.4rem .8rem;cursor:pointer}label{display:block;margin:.4rem 0}input[type=text],input[type=email],input[type=url]{width:100%;padding:.3rem}
.note{color:#666;font-size:13px}.error{color:#b00}</style></head>
<body>
<h1>Sign in with ${label}</h1>
<p class="note">Kiln's local ${label} emulator: no real account is used. <b>${escapeHtml(p.clientId)}</b> asks for: ${escapeHtml(p.scopes.join(" ") || "(no scopes)")}.</p>
${p.error ? `<p class="error" role="alert">${escapeHtml(p.error)}</p>` : ""}
<h2>Choose an account</h2>
<ul id="identities">
${people}
</ul>
<h2>Or use another account</h2>
<form method="post" action="${escapeHtml(p.loginAction)}" id="new-identity">${keep}
<label>Email <input type="email" name="email" required value="${escapeHtml(p.loginHint ?? "")}"></label>
<label>Name <input type="text" name="name"></label>
<label>Picture URL <input type="url" name="picture"></label>
<label><input type="checkbox" name="email_verified" value="true" checked> Email verified</label>
<button type="submit" id="sign-in">Sign in</button>
</form>
<h2>Or</h2>
<form method="post" action="${escapeHtml(p.denyAction)}">${keep}<button type="submit" id="deny">Deny access</button></form>
</body></html>`;
}

export function renderErrorPage(kind: string, message: string): string {
  return `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>${providerLabel(kind)} emulator: error</title></head>
<body style="font:15px system-ui,sans-serif;max-width:36rem;margin:2rem auto"><h1>Sign-in error</h1><p role="alert">${escapeHtml(message)}</p></body></html>`;
}

/** The identity a login form names: an existing one (`identity`) or the typed fields. */
export function identityFromForm(form: URLSearchParams): { identity: string } | { email: string; name?: string; picture?: string; email_verified: boolean } {
  const id = form.get("identity");
  if (id) return { identity: id };
  return {
    email: form.get("email") ?? "",
    name: form.get("name") || undefined,
    picture: form.get("picture") || undefined,
    email_verified: form.get("email_verified") === "true" || form.get("email_verified") === "on",
  };
}
