// Shared test helpers: a temporary directory per test, and the kinds of world every
// conformance test runs against.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
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

/** The root of the package, for spawning scripts. */
export const packageRoot = join(__dirname, '..');
