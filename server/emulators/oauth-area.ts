import { createOAuthEmulators } from "../../emulators/oauth/emulators";
import { defineArea } from "../area";
import type { Platform } from "../platform";
import { oauthEmulatorRoutes, type OAuthEmulatorRouteDeps } from "./oauth-routes";

/**
 * Local OAuth / OpenID Connect providers (google, microsoft, apple, github) under
 * /_emulators/oauth on Kiln's own port: the issuers carry Kiln's public URL, read when a provider
 * first serves a request (the port is known only once Kiln listens). oidc-provider loads then too,
 * so a Kiln that never signs anyone in with OAuth pays nothing at start. Off in the production
 * profile (anyone could sign in as anyone) unless KILN_OAUTH_EMULATORS=on.
 */
export const oauthEmulatorsArea = defineArea({
  name: "oauth-emulators",
  start: ({ config, address, log }: Pick<Platform, "config" | "address" | "log">): OAuthEmulatorRouteDeps => {
    if (!config.oauthEmulators) return { oauthEmulators: null };
    const oauthEmulators = createOAuthEmulators({ baseUrl: () => address.publicUrl() });
    log.info("OAuth providers (google, microsoft, apple, github) at /_emulators/oauth");
    return { oauthEmulators };
  },
  routes: oauthEmulatorRoutes,
  stop: async ({ oauthEmulators }) => {
    await oauthEmulators?.stop().catch(() => {});
  },
});
