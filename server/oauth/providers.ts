/** The providers Kiln signs end users in with, and what the spec fixes about each. */
export const PROVIDER_IDS = ["google", "github", "microsoft", "apple", "device"] as const;
export type ProviderId = (typeof PROVIDER_IDS)[number];
/** Providers an end user signs in with through a browser redirect (all but the device flow). */
export type RedirectProviderId = Exclude<ProviderId, "device">;

export interface ProviderInfo {
  id: ProviderId;
  name: string;
  default_scopes: string[];
  /** OpenID Connect (discovery, ID token) or GitHub's plain OAuth 2 with its REST API. */
  protocol: "oidc" | "github" | "device";
  /** The real provider: an OIDC issuer, or GitHub's web address. */
  realIssuer: string | null;
}

export const PROVIDERS: Record<ProviderId, ProviderInfo> = {
  google: { id: "google", name: "Google", default_scopes: ["openid", "email", "profile"], protocol: "oidc", realIssuer: "https://accounts.google.com" },
  github: { id: "github", name: "GitHub", default_scopes: ["read:user", "user:email"], protocol: "github", realIssuer: "https://github.com" },
  // "common" accepts work, school and personal accounts; its ID tokens name the user's own tenant as issuer.
  microsoft: {
    id: "microsoft",
    name: "Microsoft",
    default_scopes: ["openid", "email", "profile"],
    protocol: "oidc",
    realIssuer: "https://login.microsoftonline.com/common/v2.0",
  },
  apple: { id: "apple", name: "Apple", default_scopes: ["email", "name"], protocol: "oidc", realIssuer: "https://appleid.apple.com" },
  device: { id: "device", name: "Device authorization (RFC 8628)", default_scopes: [], protocol: "device", realIssuer: null },
};

export function isProvider(p: string): p is ProviderId {
  return (PROVIDER_IDS as readonly string[]).includes(p);
}
