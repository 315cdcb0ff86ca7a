import { accessTokensArea } from "./access-tokens/area";
import { accountsArea } from "./accounts/area";
import type { CheckOrder } from "./area";
import { configArea } from "./config/area";
import { consoleArea } from "./console/area";
import { databasesArea } from "./databases/area";
import { deploymentsArea } from "./deployments/area";
import { durableArea } from "./durable/area";
import { mailArea } from "./emulators/area";
import { oauthEmulatorsArea } from "./emulators/oauth-area";
import { endUsersArea } from "./end-users/area";
import { frontendsArea } from "./frontends/area";
import { functionsArea } from "./functions/area";
import { healthArea } from "./health/area";
import { keysArea } from "./keys/area";
import { logsArea } from "./logs/area";
import { mcpArea } from "./mcp/area";
import { metricsArea } from "./metrics/area";
import { oauthArea } from "./oauth/area";
import { locksArea } from "./locks/area";
import type { Platform } from "./platform";
import { projectsArea } from "./projects/area";
import { schedulersArea } from "./schedulers/area";
import { secretsArea } from "./secrets/area";
import { storageArea } from "./storage/area";
import type { Migration } from "./store/migrations";
import { testingArea } from "./testing/area";
import { variablesArea } from "./variables/area";

/**
 * Kiln's API areas, in start order: each may use the platform and the areas above it (checked by
 * the type below). Routes appear in the OpenAPI document in this order. A new area is a folder
 * with an `area.ts` and one line here.
 */
export const AREAS = [
  healthArea,
  secretsArea,
  accountsArea,
  projectsArea,
  accessTokensArea,
  keysArea,
  variablesArea,
  mailArea,
  oauthEmulatorsArea,
  endUsersArea,
  oauthArea,
  databasesArea,
  logsArea,
  metricsArea,
  // Before functions: its host router (site names, custom domains) is tried first, so a static file
  // costs no function-address parsing (bench/frontends).
  frontendsArea,
  functionsArea,
  durableArea,
  schedulersArea,
  deploymentsArea,
  storageArea,
  locksArea,
  configArea,
  testingArea,
  mcpArea,
  consoleArea,
] as const;

/** A compile error here names an area listed before something it needs. */
const order: CheckOrder<typeof AREAS, Platform> = "ok";
void order;

/** The control store's schema: every area's migrations, in area order. */
export const SCHEMA: readonly Migration[] = AREAS.flatMap((a) => a.migrations ?? []);
