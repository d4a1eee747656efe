/**
 * The examples of README.md, for tests that run them: each is the fenced code block right after an
 * `<!-- example: NAME -->` comment, so the README shows exactly what the test runs.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";

const readmePath = join(import.meta.dirname, "..", "..", "README.md");

/** An example's fence language and its code (without the fences). */
export interface ReadmeExample {
  lang: string;
  code: string;
}

/** The example named `name`; throws when README.md has none, or no fenced block after its marker. */
export function readmeExample(name: string): ReadmeExample {
  const readme = readFileSync(readmePath, "utf8");
  const marker = `<!-- example: ${name} -->`;
  const at = readme.indexOf(marker);
  if (at < 0) throw new Error(`README.md has no example marked ${marker}`);
  if (readme.indexOf(marker, at + 1) >= 0) throw new Error(`README.md marks two examples ${marker}`);
  const fence = /^\n```(\w+)\n([\s\S]*?)^```$/m.exec(readme.slice(at + marker.length));
  if (fence === null || fence.index !== 0) throw new Error(`no fenced code block right after ${marker}`);
  return { lang: fence[1] as string, code: fence[2] as string };
}

/** `code` aimed at another gateway: every `127.0.0.1:8080` of the README becomes `hostPort`. */
export function atGateway(code: string, hostPort: string): string {
  return code.replaceAll("127.0.0.1:8080", hostPort);
}
