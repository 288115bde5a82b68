// Shared test helpers: a temporary directory per test, the kinds of world every conformance test
// runs against, and the check for a system component a test needs.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterEach } from 'vitest';
import { localWorld, virtualWorld, type PricingRegistry, type World, type WorldError } from '@little-workflow/world';

const dirs: string[] = [];
const worlds: World[] = [];

afterEach(async () => {
  await Promise.all(worlds.splice(0).map((w) => w.close()));
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

/** A fresh temporary directory, removed after the test. */
export function tempDir(): string {
  const d = mkdtempSync(join(tmpdir(), 'little-world-test-'));
  dirs.push(d);
  return d;
}

/** Remember a world so it is closed after the test. */
export function track<W extends World>(w: W): W {
  worlds.push(w);
  return w;
}

/** The kinds of world the contract is checked against, opened with `pricing` if given. */
export function worldKindsWith(opts: { pricing?: PricingRegistry } = {}): ReadonlyArray<readonly [string, () => World]> {
  return [
    ['localWorld', () => track(localWorld({ ...opts, dataDir: tempDir() }))],
    ['localWorld (durability normal)', () => track(localWorld({ ...opts, dataDir: tempDir(), durability: 'normal' }))],
    ['virtualWorld', () => track(virtualWorld(opts))],
  ];
}

/** The kinds of world the contract is checked against. */
export const worldKinds = worldKindsWith();

/** The error a promise rejects with; fails the test if it resolves. */
export async function rejection(p: Promise<unknown>): Promise<WorldError> {
  try {
    await p;
  } catch (e) {
    return e as WorldError;
  }
  throw new Error('expected a rejection');
}

/**
 * Whether a system component that some tests need (`what`, such as Chromium or PostgreSQL) is
 * `present`. When it is not, outside CI this says so in a line starting `SKIPPED:` with
 * `howToEnable`, and returns false: a fresh machine passes `npm test` with those tests skipped.
 * Under `CI=true` it throws instead, so that CI never passes without running them.
 */
export function needs(what: string, present: boolean, howToEnable: string): boolean {
  if (present) return true;
  if (process.env.CI === 'true') throw new Error(`${what} is missing, and under CI=true the tests that need it must run: ${howToEnable}`);
  console.warn(`SKIPPED: tests that need ${what}, which is missing: ${howToEnable}`);
  return false;
}

/** The root of the package, for spawning scripts. */
export const packageRoot = join(__dirname, '..');

/** Take the world at `dataDir` back to schema 2, as the version before budget estimates left it. */
export function downgradeToSchema2(dataDir: string): void {
  const db = new Database(join(dataDir, 'events', 'events.db'));
  db.exec('DROP TRIGGER events_writer; DROP TABLE estimates; DROP TABLE usage_totals');
  db.pragma('user_version = 2');
  db.close();
}

/** The schema version this build writes. */
export const SCHEMA_VERSION = 5;

/**
 * Make a better-sqlite3 connection a writer of this schema, as the world's writer is: since
 * schema 4 an insert into `events` from any other connection is refused.
 */
export function asWriter(db: Database.Database): Database.Database {
  db.function('little_world_writer', (schema: unknown) => (schema === SCHEMA_VERSION ? 1 : 0));
  return db;
}

/** The schema version of the world at `dataDir`, read without opening it as a world. */
export function schemaVersion(dataDir: string): number {
  const db = new Database(join(dataDir, 'events', 'events.db'), { readonly: true });
  try {
    return db.pragma('user_version', { simple: true }) as number;
  } finally {
    db.close();
  }
}
