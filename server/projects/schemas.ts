import * as z from "zod";
import { limitParam, pageParam } from "../http/pagination";

export const projectIdParams = z.object({ projectId: z.string().min(1) });

export const projectSchema = z.object({
  id: z.string(),
  name: z.string(),
  status: z.enum(["active", "deleting", "failed"]),
  all_regions: z.boolean(),
  selected_regions: z.array(z.string()),
  cloud_application_name: z.string().optional(),
  created_at: z.string(),
  updated_at: z.string(),
});

const projectName = z.string().trim().min(1, "must not be empty").max(128, "must be at most 128 characters");
const regionList = z.array(z.string().min(1)).max(64);

export const createProjectBody = z.object({
  name: projectName,
  all_regions: z.boolean().optional(),
  selected_regions: regionList.optional(),
});

export const updateProjectBody = z.object({
  name: projectName.optional(),
  all_regions: z.boolean().optional(),
  selected_regions: regionList.optional(),
});

export const listProjectsQuery = z.object({
  page: pageParam.optional(),
  limit: limitParam.optional(),
  cursor: z.string().min(1).optional(),
  ending_before: z.string().min(1).optional(),
  offset: z.coerce.number().int().min(0).optional(),
  search: z.string().max(256, "must be at most 256 characters").optional(),
});

export const projectListSchema = z.object({
  data: z.array(projectSchema),
  page: z.number().int().optional().describe("offset mode only"),
  limit: z.number().int(),
  total: z.number().int(),
  has_more: z.boolean(),
  next: z.string().optional(),
  next_cursor: z.string().optional().describe("cursor mode: send as `cursor` for the next page"),
  prev_cursor: z.string().optional().describe("cursor mode: send as `ending_before` for the previous page"),
});
