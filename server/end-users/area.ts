import type { Mailer } from "../../emulators/mail/mailer";
import { defineArea } from "../area";
import type { KeysService } from "../keys/service";
import type { Platform } from "../platform";
import type { ProjectsService } from "../projects/service";
import { AuthConfigService } from "./config";
import { END_USERS_MIGRATIONS } from "./migrations";
import { AuthRateLimits } from "./rate-limits";
import { endUserRoutes } from "./routes";
import { EndUsersService } from "./service";
import { SigningKeys } from "./signing-keys";

type Needs = Pick<Platform, "store" | "clock" | "log" | "principals" | "address" | "secretKey"> & { mailer: Mailer; projects: ProjectsService; keys: KeysService };

/** End users of a project: sign-up, sessions, password reset and confirmation by email, signing keys. */
export const endUsersArea = defineArea({
  name: "end-users",
  migrations: END_USERS_MIGRATIONS,
  // The private half of each project's signing key (the public half is published as JWKS).
  secrets: [{ table: "auth_signing_keys", key: "kid", column: "private_jwk", json: true }],
  start: ({ store, clock, log, principals, address, mailer, secretKey }: Needs) => {
    const now = () => clock.now();
    const authConfig = new AuthConfigService(store, now);
    const signingKeys = new SigningKeys(store, now, secretKey);
    const endUsers = new EndUsersService({
      store,
      now,
      keys: signingKeys,
      config: authConfig,
      sendMail: (m) => void mailer.send(m).catch((e) => log.error(`sending mail to ${m.to} failed`, e)),
      publicUrl: () => address.publicUrl(),
      evictSession: (id) => principals.evict((p) => p.kind === "user" && p.sessionId === id),
    });
    return { endUsers, authConfig, signingKeys, authLimits: new AuthRateLimits(() => clock.nowMs()) };
  },
  routes: endUserRoutes,
  // Caches of its rows, and the sign-in rate limits (counts of requests a restore undoes).
  reset: {
    resume: ({ authConfig, signingKeys, authLimits }) => {
      authConfig.forgetAll();
      signingKeys.forgetAll();
      authLimits.clear();
    },
  },
  project: {
    // Every project gets its own signing key for end-user tokens.
    setup: async (tx, projectId, { signingKeys }) => void (await signingKeys.create(projectId, tx)),
    cleanup: async (projectId, { endUsers, authConfig, signingKeys }) => {
      await endUsers.removeAll(projectId);
      await authConfig.remove(projectId);
      await signingKeys.removeAll(projectId);
    },
  },
});
