/**
 * bench/RESULTS.md keeps the latest section of each bench, each opened by a marker line
 * `<!-- bench: NAME -->` and running to the next marker (or the end of the file). History is in git.
 */

const markerOf = (name: string): string => `<!-- bench: ${name} -->`;
const anyMarker = /^<!-- bench: [a-z0-9-]+ -->$/m;

/**
 * `results` with bench `name`'s section replaced by `section` (markdown, its own `##` heading
 * first), or appended when the file has none yet; every other section is kept as it is.
 */
export function withSection(results: string, name: string, section: string): string {
  const marker = markerOf(name);
  const block = `${marker}\n\n${section.trim()}\n\n`;
  const start = results.indexOf(`${marker}\n`);
  if (start < 0) return `${results.trimEnd()}\n\n${block}`;
  const after = start + marker.length;
  const next = results.slice(after).search(anyMarker);
  const end = next < 0 ? results.length : after + next;
  return `${results.slice(0, start)}${block}${results.slice(end)}`.replace(/\n{3,}$/, "\n");
}
