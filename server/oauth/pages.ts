import { PROVIDERS, type ProviderId } from "./providers";

const ENTITIES: Record<string, string> = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const esc = (s: string) => s.replace(/[&<>"']/g, (c) => ENTITIES[c]!);
const STYLE = `body{font:16px system-ui,sans-serif;max-width:28rem;margin:4rem auto;padding:0 1rem}input,button,a.button{font:inherit;padding:.5rem;width:100%;box-sizing:border-box;margin:.25rem 0;display:block;text-align:center}code{font-size:1.4rem;letter-spacing:.1em}#msg{margin-top:1rem}.row{display:flex;gap:.5rem}`;

function page(title: string, body: string): string {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>${esc(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>${STYLE}</style></head>
<body><h1>${esc(title)}</h1>${body}</body></html>`;
}

/** The managed device page before a code is known, or for a code that is no longer valid. */
export function deviceCodeEntryPage(problem?: string): string {
  return page(
    "Connect a device",
    `${problem ? `<p role="alert">${esc(problem)}</p>` : ""}
<form method="get" action="/auth/device"><label>The code your device shows <input name="user_code" required autocomplete="off" autofocus placeholder="BCDF-GHJK"></label>
<button type="submit">Continue</button></form>`,
  );
}

/**
 * The managed device page (RFC 8628 verification URI): the person signs in (password, or a provider
 * through the redirect flow back to this page) and approves or denies the device.
 */
export function deviceApprovalPage(o: {
  userCode: string;
  clientId: string;
  anonKey: string;
  /** This page's own address: the redirect_url of sign-ins started here. */
  selfUrl: string;
  providers: ProviderId[];
  /** After a provider sign-in: the code to exchange, or the provider's refusal. */
  code?: string;
  error?: string;
}): string {
  const data = JSON.stringify({ userCode: o.userCode, anonKey: o.anonKey, selfUrl: o.selfUrl, code: o.code ?? null }).replace(/</g, "\\u003c");
  const buttons = o.providers
    .map((p) => {
      const u = `/auth/oauth/${p}/authorize?anon_key=${encodeURIComponent(o.anonKey)}&redirect_url=${encodeURIComponent(o.selfUrl)}&client_state=${encodeURIComponent(o.userCode)}`;
      return `<a class="button" id="signin-${p}" href="${esc(u)}">Sign in with ${esc(PROVIDERS[p].name)}</a>`;
    })
    .join("\n");
  return page(
    "Connect a device",
    `<p>The device <b>${esc(o.clientId)}</b> asks to sign in as you. Check that it shows this code:</p>
<p><code id="user-code">${esc(o.userCode)}</code></p>
${o.error ? `<p role="alert" id="provider-error">The sign-in was not completed (${esc(o.error)}).</p>` : ""}
<section id="signin">
<form id="pw"><label>Email <input id="email" type="email" required autocomplete="username"></label>
<label>Password <input id="password" type="password" required autocomplete="current-password"></label>
<button type="submit">Sign in</button></form>
${buttons}
</section>
<section id="decide" hidden>
<p>Signed in as <b id="who"></b>.</p>
<div class="row"><button id="approve">Approve</button><button id="deny">Deny</button></div>
</section>
<p id="msg" role="status"></p>
<script>
const { userCode, anonKey, selfUrl, code } = ${data};
const msg = (t) => (document.getElementById("msg").textContent = t);
let accessToken = null;
function signedIn(body) {
  accessToken = body.access_token;
  document.getElementById("who").textContent = body.user.email;
  document.getElementById("signin").hidden = true;
  document.getElementById("decide").hidden = false;
  msg("");
}
async function call(path, body, bearer) {
  const res = await fetch(path, { method: "POST", headers: { "Content-Type": "application/json", Authorization: "Bearer " + bearer }, body: JSON.stringify(body) });
  return { ok: res.ok, body: await res.json().catch(() => ({})) };
}
if (code) {
  history.replaceState(null, "", location.pathname + "?user_code=" + encodeURIComponent(userCode));
  call("/auth/oauth/exchange", { code, redirect_url: selfUrl }, anonKey).then((r) => (r.ok ? signedIn(r.body) : msg(r.body.error || "The sign-in failed.")));
}
document.getElementById("pw").addEventListener("submit", async (e) => {
  e.preventDefault();
  const r = await call("/auth/signin", { email: document.getElementById("email").value, password: document.getElementById("password").value }, anonKey);
  r.ok ? signedIn(r.body) : msg(r.body.error || "The sign-in failed.");
});
for (const action of ["approve", "deny"]) {
  document.getElementById(action).addEventListener("click", async () => {
    const r = await call("/auth/device/verify", { user_code: userCode, action }, accessToken);
    if (!r.ok) return msg(r.body.error || "Something went wrong.");
    document.getElementById("decide").hidden = true;
    msg(action === "approve" ? "Device approved. You can return to your device." : "Device denied.");
  });
}
</script>`,
  );
}

/**
 * Kiln's managed sign-in page: a button per enabled provider. With the app's `redirect_url` the
 * buttons start sign-ins that return to the app (with a code, as always); without one they return
 * here, and the page spends the code and says who signed in (a way to try a project's providers by
 * hand). Tokens are never shown.
 */
export function hostedSignInPage(o: { anonKey: string; selfUrl: string; redirectUrl?: string; providers: ProviderId[]; code?: string; error?: string }): string {
  const back = o.redirectUrl ?? o.selfUrl;
  const data = JSON.stringify({ anonKey: o.anonKey, selfUrl: o.selfUrl, code: o.redirectUrl ? null : (o.code ?? null) }).replace(/</g, "\\u003c");
  const buttons = o.providers
    .map((p) => {
      const u = `/auth/oauth/${p}/authorize?anon_key=${encodeURIComponent(o.anonKey)}&redirect_url=${encodeURIComponent(back)}`;
      return `<a class="button" id="signin-${p}" href="${esc(u)}">Sign in with ${esc(PROVIDERS[p].name)}</a>`;
    })
    .join("\n");
  return page(
    "Sign in",
    `${o.error ? `<p role="alert" id="provider-error">The sign-in was not completed (${esc(o.error)}).</p>` : ""}
<section id="signin"${o.code && !o.redirectUrl ? " hidden" : ""}>${buttons || "<p>This project has no sign-in provider enabled.</p>"}</section>
<p id="msg" role="status"></p>
<script>
const { anonKey, selfUrl, code } = ${data};
if (code) {
  history.replaceState(null, "", selfUrl);
  fetch("/auth/oauth/exchange", { method: "POST", headers: { "Content-Type": "application/json", Authorization: "Bearer " + anonKey }, body: JSON.stringify({ code, redirect_url: selfUrl }) })
    .then(async (res) => {
      const body = await res.json().catch(() => ({}));
      if (!res.ok) {
        document.getElementById("signin").hidden = false;
        return (document.getElementById("msg").textContent = body.error || "The sign-in failed.");
      }
      const who = document.createElement("b");
      who.id = "who";
      who.textContent = body.user.email;
      const msg = document.getElementById("msg");
      msg.append("Signed in as ", who, res.status === 201 ? " (a new account)." : ".");
    });
}
</script>`,
  );
}
