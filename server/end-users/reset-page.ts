/** The hosted page a reset link leads to when the request named no redirect_url of the app's own. */
export function resetPasswordPage(token: string, anonKey: string): string {
  const data = JSON.stringify({ token, anonKey }).replace(/</g, "\\u003c");
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Reset your password</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{font:16px system-ui,sans-serif;max-width:28rem;margin:4rem auto;padding:0 1rem}input,button{font:inherit;padding:.5rem;width:100%;box-sizing:border-box;margin:.25rem 0}#msg{margin-top:1rem}</style>
</head><body>
<h1>Reset your password</h1>
<form id="f"><label>New password <input id="pw" type="password" minlength="8" required autocomplete="new-password"></label>
<button type="submit">Set password</button></form>
<p id="msg" role="status"></p>
<script>
const { token, anonKey } = ${data};
document.getElementById("f").addEventListener("submit", async (e) => {
  e.preventDefault();
  const res = await fetch("/auth/reset-password", {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: "Bearer " + anonKey },
    body: JSON.stringify({ token, password: document.getElementById("pw").value }),
  });
  const body = await res.json().catch(() => ({}));
  document.getElementById("msg").textContent = res.ok ? "Your password has been changed. You can close this page." : (body.error || "Something went wrong.");
  if (res.ok) document.getElementById("f").remove();
});
</script>
</body></html>`;
}
