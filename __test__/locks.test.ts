// Run locks and outer-loop manifests.
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, symlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import {
  acquireOuterLoopLock,
  acquireRunLock,
  localWorld,
  OuterLoopInputMismatchError,
  readOuterLoopManifest,
  RunLockedError,
  WorldClosedError,
  WorldPathError,
  writeOuterLoopManifest,
  type WorldError,
} from '@little-workflow/world';
import { packageRoot, tempDir, track, worldKinds, rejection } from './helpers';


const lockDir = (dataDir: string, name: string) => join(dataDir, 'locks', createHash('sha256').update(name).digest('hex'));

describe.each(worldKinds)('locks on %s', (_name, makeWorld) => {
  it('lets one holder at a time take a run lock, and refuses others after waitMs', async () => {
    const world = makeWorld();
    const lock = await acquireRunLock(world, 'run_l');
    expect(lock.name).toBe('run:run_l');
    const started = Date.now();
    const err = await rejection(acquireRunLock(world, 'run_l', { waitMs: 150 }));
    expect(Date.now() - started).toBeGreaterThanOrEqual(140);
    expect(err).toBeInstanceOf(RunLockedError);
    expect(err.code).toBe('RUN_LOCKED');
    expect(await rejection(acquireRunLock(world, 'run_l'))).toBeInstanceOf(RunLockedError);
    // Other runs and outer loops are other locks.
    const other = await acquireRunLock(world, 'run_m');
    const loop = await acquireOuterLoopLock(world, 'run_l');
    await Promise.all([other.release(), loop.release()]);
    await lock.release();
    await lock.release(); // idempotent
    const again = await acquireRunLock(world, 'run_l');
    expect(again.token).not.toBe(lock.token);
    // A third release of the old lock, now that another holder has it: still a no-op, and the
    // new holder keeps it.
    await lock.release();
    expect(await rejection(acquireRunLock(world, 'run_l'))).toBeInstanceOf(RunLockedError);
    await again.release();
  });

  it('hands the lock to a waiting taker when it is released', async () => {
    const world = makeWorld();
    const lock = await acquireRunLock(world, 'run_w');
    const waiting = acquireRunLock(world, 'run_w', { waitMs: 5000 });
    setTimeout(() => void lock.release(), 100);
    const next = await waiting;
    expect(next.token).not.toBe(lock.token);
    await next.release();
  });

  it('lets go of its locks at close: a waiting taker rejects, and a release after the close resolves', async () => {
    const world = makeWorld();
    const lock = await acquireRunLock(world, 'run_close');
    const waiting = rejection(acquireRunLock(world, 'run_close', { waitMs: 10_000 }));
    await new Promise((r) => setTimeout(r, 50));
    const started = Date.now();
    await world.close();
    expect(await waiting).toBeInstanceOf(WorldClosedError);
    expect(Date.now() - started).toBeLessThan(2000);
    await lock.release(); // close let go of it already: a no-op, as a double release is
    await lock.release();
    expect(await rejection(acquireRunLock(world, 'run_close'))).toBeInstanceOf(WorldClosedError);
  });

  it('rejects malformed names before any I/O', async () => {
    const world = makeWorld();
    expect(await rejection(acquireRunLock(world, 'run_../x'))).toBeInstanceOf(WorldPathError);
    expect(await rejection(acquireOuterLoopLock(world, 'a/b'))).toBeInstanceOf(WorldPathError);
  });
});

describe('locks on disk', () => {
  it('keeps owner.json {pid, token, createdAt, flock} and refuses a release by a token that does not own the lock', async () => {
    const dataDir = tempDir();
    const world = track(localWorld({ dataDir }));
    const lock = await acquireRunLock(world, 'run_own');
    const ownerPath = join(lockDir(dataDir, 'run:run_own'), 'owner.json');
    const owner = JSON.parse(readFileSync(ownerPath, 'utf8'));
    // The owner holds an flock on owner.json for as long as it holds the lock.
    const flock = process.platform === 'win32' ? undefined : true;
    expect(owner).toEqual({ pid: process.pid, token: lock.token, createdAt: expect.stringMatching(/Z$/), flock });
    // Someone else takes over the lock (as a recovery would): the old holder may not release it.
    writeFileSync(ownerPath, JSON.stringify({ ...owner, token: 'lck_someone_else' }));
    expect(await rejection(lock.release())).toBeInstanceOf(RunLockedError);
    expect(existsSync(ownerPath)).toBe(true);
  });

  it('recovers a lock whose owner process is gone, and respects a fresh lock whose owner is not written yet', async () => {
    const dataDir = tempDir();
    const world = track(localWorld({ dataDir }));
    const dead = lockDir(dataDir, 'run:run_dead');
    mkdirSync(dead);
    writeFileSync(join(dead, 'owner.json'), JSON.stringify({ pid: 2147483646, token: 'lck_dead', createdAt: '2026-01-01T00:00:00.000Z' }));
    const lock = await acquireRunLock(world, 'run_dead');
    expect(lock.token).not.toBe('lck_dead');

    const fresh = lockDir(dataDir, 'run:run_fresh');
    mkdirSync(fresh);
    expect(await rejection(acquireRunLock(world, 'run_fresh', { waitMs: 50 }))).toBeInstanceOf(RunLockedError);
    // After the 30 s grace, an ownerless lock is presumed abandoned.
    const past = new Date(Date.now() - 31_000);
    utimesSync(fresh, past, past);
    const taken = await acquireRunLock(world, 'run_fresh');
    expect(taken.token).toMatch(/^lck_/);
    expect(readdirSync(join(dataDir, 'locks')).filter((f) => f.endsWith('.recovery'))).toEqual([]);
  });

  it('frees a closed world\'s locks for other worlds at once', async () => {
    const dataDir = tempDir();
    const a = track(localWorld({ dataDir }));
    const b = track(localWorld({ dataDir }));
    const lock = await acquireRunLock(a, 'run_freed');
    await a.close();
    expect(existsSync(lockDir(dataDir, 'run:run_freed'))).toBe(false);
    const taken = await acquireRunLock(b, 'run_freed');
    await lock.release(); // a no-op: it does not let go of b's lock
    expect(await rejection(acquireRunLock(b, 'run_freed'))).toBeInstanceOf(RunLockedError);
    await taken.release();
  });

  it('makes two paths to one data directory contend for the same lock', async () => {
    const dataDir = tempDir();
    const link = join(tempDir(), 'link');
    symlinkSync(dataDir, link);
    const a = track(localWorld({ dataDir }));
    const b = track(localWorld({ dataDir: link }));
    expect(b.dataDir).toBe(a.dataDir);
    const lock = await acquireRunLock(a, 'run_same');
    expect(await rejection(acquireRunLock(b, 'run_same'))).toBeInstanceOf(RunLockedError);
    await lock.release();
    await (await acquireRunLock(b, 'run_same')).release();
  });

  it('refuses a second process while the holder lives, and hands over when it is killed', async () => {
    const dataDir = tempDir();
    const child = spawn(process.execPath, [join(__dirname, 'fixtures', 'lock-child.cjs'), dataDir, 'run_fence'], { cwd: packageRoot });
    const token = await new Promise<string>((resolve, reject) => {
      let buf = '';
      child.stdout.on('data', (d) => {
        buf += d;
        const m = /locked (\S+)/.exec(buf);
        if (m) resolve(m[1]);
      });
      child.on('exit', (code) => reject(new Error(`child exited ${code}`)));
    });
    const world = track(localWorld({ dataDir }));
    const err = await rejection(acquireRunLock(world, 'run_fence', { waitMs: 100 }));
    expect(err).toBeInstanceOf(RunLockedError);
    expect(err.details.ownerPid).toBe(child.pid);
    const exited = new Promise((r) => child.on('exit', r));
    child.kill('SIGKILL');
    await exited;
    const lock = await acquireRunLock(world, 'run_fence', { waitMs: 5000 });
    expect(lock.token).not.toBe(token);
    await lock.release();
  });

  // A container restarted on its data directory often gets its old pid back. Simulated here: a
  // child takes a lock and is killed, and its owner record is given this process's pid, as if this
  // process were its restart. The lock used to look held by this live process for as long as it ran.
  it.runIf(process.platform !== 'win32')('recovers a lock whose owner pid is now a later process', async () => {
    const dataDir = tempDir();
    const child = spawn(process.execPath, [join(__dirname, 'fixtures', 'lock-child.cjs'), dataDir, 'run_reused'], { cwd: packageRoot });
    await new Promise<void>((resolve, reject) => {
      child.stdout.on('data', (d) => String(d).includes('locked ') && resolve());
      child.on('exit', (code) => reject(new Error(`child exited ${code}`)));
    });
    const exited = new Promise((r) => child.on('exit', r));
    child.kill('SIGKILL');
    await exited;
    const ownerFile = join(lockDir(dataDir, 'run:run_reused'), 'owner.json');
    const owner = JSON.parse(readFileSync(ownerFile, 'utf8'));
    expect(owner.flock).toBe(true);
    writeFileSync(ownerFile, JSON.stringify({ ...owner, pid: process.pid }));

    const world = track(localWorld({ dataDir }));
    const lock = await acquireRunLock(world, 'run_reused');
    expect(lock.token).not.toBe(owner.token);
    // This process's own record, by contrast, is held by a live process: another world may hold it.
    const err = await rejection(acquireRunLock(track(localWorld({ dataDir })), 'run_reused'));
    expect(err).toBeInstanceOf(RunLockedError);
    expect(err.details.ownerPid).toBe(process.pid);
    await lock.release();
  });
});

describe.each(worldKinds)('outer-loop manifests on %s', (_name, makeWorld) => {
  it('writes and reads manifests, refuses another inputHash, and keeps pendingCycleRunId until cleared', async () => {
    const world = makeWorld();
    expect(await readOuterLoopManifest(world, 'ol_1')).toBeUndefined();
    const base = { outerLoopId: 'ol_1', goal: { description: 'find a date' }, maxCycles: 5, inputHash: 'sha256:abc' };
    await writeOuterLoopManifest(world, { ...base, cycles: [], pendingCycleRunId: 'run_cycle_1' });
    await writeOuterLoopManifest(world, { ...base, cycles: [{ cycleNumber: 1, runId: 'run_cycle_1', status: 'completed', output: { ok: 1 } }] });
    const mid = await readOuterLoopManifest(world, 'ol_1');
    expect(mid?.pendingCycleRunId).toBe('run_cycle_1');
    expect(mid?.cycles?.[0].output).toEqual({ ok: 1 });
    expect(Object.isFrozen(mid)).toBe(true);
    await writeOuterLoopManifest(world, { ...base, pendingCycleRunId: null, result: { kind: 'done', finalOutput: 42 } });
    const done = await readOuterLoopManifest(world, 'ol_1');
    expect(done?.pendingCycleRunId).toBeUndefined();
    expect(done?.result).toEqual({ kind: 'done', finalOutput: 42 });
    const err = await rejection(writeOuterLoopManifest(world, { ...base, inputHash: 'sha256:other' }));
    expect(err).toBeInstanceOf(OuterLoopInputMismatchError);
    expect(err.code).toBe('OUTER_LOOP_INPUT_MISMATCH');
    expect((await readOuterLoopManifest(world, 'ol_1'))?.inputHash).toBe('sha256:abc');
    expect(await rejection(writeOuterLoopManifest(world, { outerLoopId: '../evil', inputHash: 'x' }))).toBeInstanceOf(WorldPathError);
  });

  it('takes overlapping writes of one manifest in turn: each resolves or is refused for its inputHash', async () => {
    const world = makeWorld();
    for (let round = 0; round < 3; round++) {
      const outerLoopId = `ol_race_${round}`;
      const writes = Array.from({ length: 12 }, (_, i) => writeOuterLoopManifest(world, { outerLoopId, inputHash: `h${i % 2}`, note: i, cycles: [] }));
      const settled = await Promise.allSettled(writes);
      const stored = await readOuterLoopManifest(world, outerLoopId);
      expect(stored).toBeDefined();
      settled.forEach((r, i) => {
        if (r.status === 'fulfilled') expect(`h${i % 2}`).toBe(stored?.inputHash);
        else expect((r.reason as WorldError).code, String(r.reason)).toBe('OUTER_LOOP_INPUT_MISMATCH');
      });
      // The stored manifest is one that resolved.
      expect(settled[stored?.note as number].status).toBe('fulfilled');
    }
  });

  it('refuses a manifest that does not have the shape of an outer-loop manifest, naming the field', async () => {
    const world = makeWorld();
    const base = { outerLoopId: 'ol_shape', inputHash: 'sha256:1' };
    for (const [bad, path] of [
      [{ ...base, cycles: 'no' }, 'manifest.cycles'],
      [{ ...base, maxCycles: -1 }, 'manifest.maxCycles'],
      [{ ...base, result: { kind: 'maybe' } }, 'manifest.result.kind'],
      [{ ...base, cycles: [{ cycleNumber: 1, status: 'completed' }] }, 'manifest.cycles[0].runId'],
    ] as const) {
      const err = await rejection(writeOuterLoopManifest(world, bad as never));
      expect(err.code, path).toBe('EVENT_VALIDATION');
      expect(err.path, path).toBe(path);
    }
    expect(await readOuterLoopManifest(world, 'ol_shape')).toBeUndefined();
  });
});

describe('outer-loop manifests on disk', () => {
  it('publishes outer-loops/<id>.json atomically, leaving no temporary file', async () => {
    const dataDir = tempDir();
    const world = track(localWorld({ dataDir }));
    await writeOuterLoopManifest(world, { outerLoopId: 'ol_disk', inputHash: 'sha256:1', cycles: [] });
    expect(readdirSync(join(dataDir, 'outer-loops'))).toEqual(['ol_disk.json']);
    expect(JSON.parse(readFileSync(join(dataDir, 'outer-loops', 'ol_disk.json'), 'utf8'))).toEqual({ outerLoopId: 'ol_disk', inputHash: 'sha256:1', cycles: [] });
  });

  it('reports a stored file that is not the requested manifest as corrupt', async () => {
    const dataDir = tempDir();
    const world = track(localWorld({ dataDir }));
    await writeOuterLoopManifest(world, { outerLoopId: 'ol_a', inputHash: 'sha256:1' });
    const file = join(dataDir, 'outer-loops', 'ol_a.json');
    for (const text of ['[]', '{"outerLoopId":"ol_b","inputHash":"sha256:1"}', '{"outerLoopId":"ol_a"}', '{"outerLoopId":"ol_a",']) {
      writeFileSync(file, text);
      const err = await rejection(readOuterLoopManifest(world, 'ol_a'));
      expect(err.code, text).toBe('RUNTIME_INTEGRITY');
      // No field names the damaged file; the message does, which is the promise.
      expect(err.message, text).toContain('ol_a.json');
    }
  });
});
