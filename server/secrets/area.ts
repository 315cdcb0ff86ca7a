import { defineArea } from "../area";
import { SECRETS_MIGRATIONS } from "./migrations";

/**
 * The instance secret key's record in the control store. The key itself is the platform's
 * (`secretKey`); the check and the encryption passes run before any area starts (server/main.ts),
 * since every area's secret columns must be readable by then.
 */
export const secretsArea = defineArea({
  name: "secrets",
  migrations: SECRETS_MIGRATIONS,
  start: () => ({}),
});
