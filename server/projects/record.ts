/** A project row as the services and the guard see it (no HTTP or store types here: the guard and
 * route typing import it, so it must not import them back). */
export type ProjectStatus = "active" | "deleting" | "failed" | "deleted";

export interface ProjectRecord {
  id: string;
  account_id: string;
  name: string;
  status: ProjectStatus;
  all_regions: boolean;
  selected_regions: string[];
  created_at: string;
  updated_at: string;
}
