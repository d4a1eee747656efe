import type { z } from "zod";

/** `["models", 0, "upstreams", 1, "url"]` → `models[0].upstreams[1].url`. */
export function formatPath(path: readonly PropertyKey[]): string {
  let out = "";
  for (const part of path) {
    if (typeof part === "number") out += `[${part}]`;
    else out += out === "" ? String(part) : `.${String(part)}`;
  }
  return out;
}

/**
 * zod's issues (parsed with `reportInput: true`) as one line: `where: problem; where: problem`.
 * An unknown key is named, with the keys allowed there (`allowedKeys(path)`); a missing key is
 * "is required".
 */
export function formatIssues(
  issues: readonly z.core.$ZodIssue[],
  allowedKeys: (path: readonly PropertyKey[]) => readonly string[] = () => [],
): string {
  return issues
    .map((issue) => {
      const where = formatPath(issue.path);
      if (issue.code === "unrecognized_keys") {
        const allowed = allowedKeys(issue.path);
        const named = issue.keys.map((k) => JSON.stringify(k)).join(", ");
        return `${where === "" ? "" : `${where}: `}unknown key${issue.keys.length > 1 ? "s" : ""} ${named}${
          allowed.length > 0 ? ` (allowed: ${allowed.join(", ")})` : ""
        }`;
      }
      if (issue.code === "invalid_type" && issue.input === undefined) return `${where} is required`;
      return `${where === "" ? "" : `${where} `}${issue.message}`;
    })
    .join("; ");
}
