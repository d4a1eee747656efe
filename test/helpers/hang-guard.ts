/**
 * Tests assert behaviour, never speed: the only time limits in the suite are hang guards, far
 * above what any test needs on a busy machine. Speed is measured by `npm run bench`.
 */

/** How long one test or hook may run before vitest fails it as hung (vitest.config.ts), ms. */
export const HANG_GUARD_MS = 180_000;

/**
 * Resolves once `cond()` is true, polling every `intervalMs`. It has no deadline of its own: a
 * condition that never holds is caught by the per-test hang guard (and the loop gives up after
 * {@link HANG_GUARD_MS}, so that it never outlives its test by long).
 */
export async function until(
  cond: () => boolean | Promise<boolean>,
  what: string,
  intervalMs = 10,
): Promise<void> {
  const giveUp = Date.now() + HANG_GUARD_MS;
  while (!(await cond())) {
    if (Date.now() > giveUp) throw new Error(`never happened: ${what}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}
