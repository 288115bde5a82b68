// A world opened with `readOnly`: it reads what other worlds commit, refuses every write with a
// typed error, and leaves the data directory exactly as it found it (no upgrade, nothing created).
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, existsSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  acquireOuterLoopLock,
  acquireRunLock,
  appendEvent,
  appendRunEvent,
  EventValidationError,
  listEvents,
  listRuns,
  localWorld,
  materializeRunState,
  readArtifact,
  readOuterLoopManifest,
  subscribe,
  verifyWorld,
  WorldClosedError,
  WorldPathError,
  writeArtifact,
  writeOuterLoopManifest,
} from '@little-workflow/world';
import { downgradeToSchema2, packageRoot, rejection, schemaVersion, tempDir, track } from './helpers';

/**
 * Every file under `dir` with its size and content hash, so any change to the directory shows;
 * except SQLite's own index of the WAL and an empty WAL, which any reader of a WAL database may
 * create beside it.
 */
function snapshot(dir: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name of readdirSync(dir, { recursive: true }) as string[]) {
    const p = join(dir, name);
    const st = statSync(p);
    if (name.endsWith('events.db-shm') || (name.endsWith('events.db-wal') && st.size === 0)) continue;
    out[name] = st.isDirectory() ? 'dir' : `${st.size}:${createHash('sha256').update(readFileSync(p)).digest('hex')}`;
  }
  return out;
}

async function seeded() {
  const dataDir = tempDir();
  const world = localWorld({ dataDir });
  const art = await writeArtifact(world, { runId: 'run_ro', stepPath: 's', name: 'o', contentType: 'text/plain', encoding: 'utf8', payload: 'hello' });
  await appendEvent(world, 'run_ro', { type: 'RunStarted', payload: {} });
  await appendEvent(world, 'run_ro', { type: 'StepCompleted', payload: { stepPath: 's', outputRef: art.artifactRef } });
  await writeOuterLoopManifest(world, { outerLoopId: 'ol_ro', goal: { description: 'g' }, maxCycles: 2, inputHash: 'sha256:abc', cycles: [] });
  await world.close();
  return { dataDir, art };
}

describe('localWorld({ readOnly: true })', () => {
  it('reads everything and refuses every write with WorldPathError, writing nothing', async () => {
    const { dataDir, art } = await seeded();
    const before = snapshot(dataDir);
    const world = track(localWorld({ dataDir, readOnly: true }));
    expect(world.kind).toBe('local');
    expect((await listEvents(world, 'run_ro')).map((e) => e.type)).toEqual(['RunStarted', 'StepCompleted']);
    expect((await materializeRunState(world, 'run_ro')).eventCount).toBe(2);
    expect((await readArtifact(world, art.artifactRef)).payload).toBe('hello');
    expect((await readOuterLoopManifest(world, 'ol_ro'))?.maxCycles).toBe(2);
    expect((await listRuns(world)).map((r) => r.runId)).toEqual(['run_ro']);
    expect((await verifyWorld(world)).ok).toBe(true);

    const writes: Array<[string, Promise<unknown>]> = [
      ['an append', appendEvent(world, 'run_ro', { type: 'StepStarted', payload: { stepPath: 't' } })],
      ['an append', appendRunEvent(world, 'run_ro2', { type: 'run:started', executionMode: 'local', inputs: {}, workflowId: '3f2b8c1e-9a4d-4e6f-8b2a-1c3d5e7f9a0b' })],
      ['writing an artifact', writeArtifact(world, { runId: 'run_ro', stepPath: 's', name: 'p', contentType: 'text/plain', encoding: 'utf8', payload: 'x' })],
      ['taking a lock', acquireRunLock(world, 'run_ro')],
      ['taking a lock', acquireOuterLoopLock(world, 'ol_ro')],
      ['writing an outer-loop manifest', writeOuterLoopManifest(world, { outerLoopId: 'ol_ro', goal: { description: 'g' }, maxCycles: 3, inputHash: 'sha256:abc', cycles: [] })],
    ];
    for (const [what, p] of writes) {
      const err = await rejection(p);
      expect(err, what).toBeInstanceOf(WorldPathError);
      expect(err.code, what).toBe('WORLD_PATH');
      // No field says why: the message names the data directory and says it was opened read-only.
      expect(err.message, what).toContain(world.dataDir!);
      expect(err.message, what).toContain('opened read-only');
    }
    await world.close();
    expect(snapshot(dataDir)).toEqual(before);
  });

  it('sees what a writable world commits after it opened, also through subscribe', async () => {
    const { dataDir } = await seeded();
    const reader = track(localWorld({ dataDir, readOnly: true }));
    const writer = track(localWorld({ dataDir, durability: 'normal' }));
    const it = subscribe(reader, 'run_new')[Symbol.asyncIterator]();
    const next = it.next();
    await appendEvent(writer, 'run_new', { type: 'RunStarted', payload: { n: 1 } });
    expect((await next).value?.payload).toEqual({ n: 1 });
    await it.return?.();
    expect((await listEvents(reader, 'run_new')).length).toBe(1);
  });

  it('does not upgrade a world an earlier version wrote, which that version can then still open', async () => {
    const { dataDir } = await seeded();
    downgradeToSchema2(dataDir);
    const world = track(localWorld({ dataDir, readOnly: true }));
    expect((await listEvents(world, 'run_ro')).length).toBe(2);
    await world.close();
    expect(schemaVersion(dataDir)).toBe(2);
  });

  it('does not create or tidy anything: no directories, no cleanup of leftovers', async () => {
    const { dataDir } = await seeded();
    rmSync(join(dataDir, 'locks'), { recursive: true, force: true });
    rmSync(join(dataDir, 'artifacts'), { recursive: true, force: true });
    const world = track(localWorld({ dataDir, readOnly: true }));
    expect((await listEvents(world, 'run_ro')).length).toBe(2);
    // Verifying says what is missing (it used to fail listing the missing directory).
    const report = await verifyWorld(world);
    expect(report.ok).toBe(false);
    expect(report.problems.map((p) => p.kind)).toEqual(['missing-artifact']);
    await world.close();
    expect(existsSync(join(dataDir, 'locks'))).toBe(false);
    expect(existsSync(join(dataDir, 'artifacts'))).toBe(false);
  });

  it('fails with WorldPathError where there is no world, creating nothing', async () => {
    const base = tempDir();
    const missing = join(base, 'nowhere');
    for (const dataDir of [missing, base]) {
      const err = (() => {
        try {
          localWorld({ dataDir, readOnly: true });
        } catch (e) {
          return e as Error;
        }
        throw new Error('opened');
      })();
      expect(err).toBeInstanceOf(WorldPathError);
      expect((err as WorldPathError).code).toBe('WORLD_PATH');
      // No field says why: the message says there is no world there.
      expect(err.message).toMatch(/^no world at /);
    }
    expect(existsSync(missing)).toBe(false);
    expect(readdirSync(base)).toEqual([]);
  });

  it('takes only a boolean, and a closed read-only world says it is closed', async () => {
    const { dataDir } = await seeded();
    expect(() => localWorld({ dataDir, readOnly: 'yes' as never })).toThrow(EventValidationError);
    const world = localWorld({ dataDir, readOnly: true });
    await world.close();
    expect(await rejection(appendEvent(world, 'run_ro', { type: 'RunStarted', payload: {} }))).toBeInstanceOf(WorldClosedError);
    expect(await rejection(writeArtifact(world, { runId: 'run_ro', stepPath: 's', name: 'p', contentType: 'text/plain', encoding: 'utf8', payload: 'x' }))).toBeInstanceOf(WorldClosedError);
  });
});

const LITTLE = join(packageRoot, 'bin', 'little.js');
const asRoot = process.getuid?.() === 0;

/** Whether `unshare -rm` can make a mount namespace here, in which a bind mount can be read-only. */
const canMountReadOnly = (() => {
  const r = spawnSync('unshare', ['-rm', 'true'], { encoding: 'utf8' });
  return r.status === 0;
})();
if (process.platform === 'linux' && !canMountReadOnly) {
  console.warn('SKIPPED: the read-only mount tests need `unshare -rm` (util-linux, with user namespaces enabled)');
}

type Little = { status: number | null; stdout: string; stderr: string };

/** Run `little <args> --data-dir <the world>` where the world is on a read-only bind mount. */
function onReadOnlyMount(dataDir: string, args: string[]): Little {
  const at = tempDir();
  const script = 'mount --bind -o ro "$1" "$2" && shift 2 && exec "$@"';
  return spawnSync('unshare', ['-rm', 'sh', '-c', script, 'sh', dataDir, at, process.execPath, LITTLE, ...args, '--data-dir', at], { encoding: 'utf8' });
}

/** Run `little <args> --data-dir <the world>` as a user who cannot write the world's directories. */
function asAnotherUser(dataDir: string, args: string[]): Little {
  for (const d of [dirname(dataDir), dataDir, join(dataDir, 'events')]) chmodSync(d, 0o755);
  for (const f of readdirSync(join(dataDir, 'events'))) chmodSync(join(dataDir, 'events', f), 0o644);
  if (asRoot) return spawnSync('runuser', ['-u', 'nobody', '--', process.execPath, LITTLE, ...args, '--data-dir', dataDir], { encoding: 'utf8' });
  chmodSync(join(dataDir, 'events'), 0o555);
  try {
    return spawnSync(process.execPath, [LITTLE, ...args, '--data-dir', dataDir], { encoding: 'utf8' });
  } finally {
    chmodSync(join(dataDir, 'events'), 0o755);
  }
}

/** A world left as a process killed after five appends leaves it: its commits in the WAL. */
function crashed(): string {
  const dataDir = tempDir();
  const r = spawnSync(process.execPath, ['-e', `
    const { localWorld, appendEvent } = require(${JSON.stringify(join(packageRoot, 'world.js'))});
    (async () => {
      const w = localWorld({ dataDir: ${JSON.stringify(dataDir)} });
      for (let i = 0; i < 5; i++) await appendEvent(w, 'run_ro', { type: 'T', payload: { i } });
      process.kill(process.pid, 'SIGKILL');
    })();`]);
  expect(r.signal).toBe('SIGKILL');
  expect(statSync(join(dataDir, 'events', 'events.db-wal')).size).toBeGreaterThan(0);
  return dataDir;
}

const places: ReadonlyArray<readonly [string, (dataDir: string, args: string[]) => Little, boolean]> = [
  ['on a read-only mount', onReadOnlyMount, canMountReadOnly],
  ['as a user who cannot write the directory', asAnotherUser, process.platform === 'linux'],
];

describe.each(places)('the little command %s', (_where, run, can) => {
  it.runIf(can)('reads a world closed cleanly, and one whose WAL holds commits', async () => {
    const { dataDir } = await seeded();
    for (const dir of [dataDir, crashed()]) {
      for (const args of [['runs'], ['events', 'run_ro'], ['replay', 'run_ro'], ['verify']]) {
        const r = run(dir, args);
        expect(r.status, `${args.join(' ')}: ${r.stderr}`).toBe(0);
      }
      expect(run(dir, ['events', 'run_ro']).stdout.trim().split('\n').length).toBeGreaterThanOrEqual(2);
    }
  });

  it.runIf(can)('says exactly why it cannot read a WAL that needs recovering, which takes writing', () => {
    const dataDir = crashed();
    rmSync(join(dataDir, 'events', 'events.db-shm'));
    const r = run(dataDir, ['runs']);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('[WORLD_PATH]');
    expect(r.stderr).toContain('write access');
    expect(r.stderr).not.toContain('attempt to write a readonly database');
    // Where it can be written, the same command recovers it, and then it reads from anywhere.
    const here = spawnSync(process.execPath, [LITTLE, 'runs', '--data-dir', dataDir], { encoding: 'utf8' });
    expect(here.status, here.stderr).toBe(0);
  });
});
