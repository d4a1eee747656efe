// Runs once before the test files: says up front whether the PostgreSQL tests run, are skipped
// (and why), or — with ACS_TEST_POSTGRES=required, as .ci/run sets it — fails the run at once.
import { POSTGRES_REQUIRED, postgresUnavailable } from "./helpers/postgres.js";

let skipped: string | undefined;

export async function setup(): Promise<void> {
  const reason = await postgresUnavailable();
  if (reason === undefined) return;
  if (POSTGRES_REQUIRED)
    throw new Error(`${reason}; ACS_TEST_POSTGRES=required makes the PostgreSQL tests mandatory`);
  skipped = `\n*** ${reason}: the PostgreSQL tests are SKIPPED (start PostgreSQL, or set ACS_TEST_POSTGRES=required to fail instead) ***\n`;
  process.stderr.write(skipped);
}

export function teardown(): void {
  if (skipped !== undefined) process.stderr.write(skipped);
}
