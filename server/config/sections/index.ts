import type { Section } from "../section";
import { authSection } from "./auth";
import { databasesSection } from "./databases";
import { frontendsSection } from "./frontends";
import { durableFunctionsSection, standardFunctionsSection } from "./functions";
import { oauthSection } from "./oauth";
import { projectSection } from "./project";
import { storageSection } from "./storage";
import { variablesSection } from "./variables";

/**
 * The manifest's sections, in the order they are exported and applied. A new section is one
 * module here: its schema, export, checks and steps.
 */
export const SECTIONS: readonly Section<any>[] = [
  projectSection,
  variablesSection,
  authSection,
  oauthSection,
  standardFunctionsSection,
  durableFunctionsSection,
  databasesSection,
  storageSection,
  frontendsSection,
];
