/**
 * The client examples of proto/EXAMPLES.md (the README's, before they moved there), for tests that
 * run them: each is the fenced code block right after an `<!-- example: NAME -->` comment, so the
 * page shows exactly what the test runs.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";

const examplesPath = join(import.meta.dirname, "..", "..", "proto", "EXAMPLES.md");

/** An example's fence language and its code (without the fences). */
export interface ReadmeExample {
  lang: string;
  code: string;
}

/** The example named `name`; throws when EXAMPLES.md has none, or no fenced block after its marker. */
export function readmeExample(name: string): ReadmeExample {
  const readme = readFileSync(examplesPath, "utf8");
  const marker = `<!-- example: ${name} -->`;
  const at = readme.indexOf(marker);
  if (at < 0) throw new Error(`proto/EXAMPLES.md has no example marked ${marker}`);
  if (readme.indexOf(marker, at + 1) >= 0) throw new Error(`proto/EXAMPLES.md marks two examples ${marker}`);
  const fence = /^\n```(\w+)\n([\s\S]*?)^```$/m.exec(readme.slice(at + marker.length));
  if (fence === null || fence.index !== 0) throw new Error(`no fenced code block right after ${marker}`);
  return { lang: fence[1] as string, code: fence[2] as string };
}

/** `code` aimed at another gateway: every `127.0.0.1:8080` of the examples becomes `hostPort`. */
export function atGateway(code: string, hostPort: string): string {
  return code.replaceAll("127.0.0.1:8080", hostPort);
}
