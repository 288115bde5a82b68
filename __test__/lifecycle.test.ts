// Deleting runs, pruning the ended ones, compacting and backing up, on every world kind.
import { existsSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  acquireRunLock,
  appendEvent,
  ArtifactNotFoundError,
  backupWorld,
  compactWorld,
  deleteRun,
  EventValidationError,
  listEvents,
  listRuns,
  localWorld,
  lookupIndexEntry,
  pruneRuns,
  queryRuns,
  readArtifact,
  RunLockedError,
  subscribe,
  verifyWorld,
  virtualWorld,
  WorldPathError,
  writeArtifact,
  type World,
} from '../world';
import { durableKinds, freshSchema, killedChild, needsPostgres, postgresUrl, rejection, tempDir, track, worldKinds } from './helpers';
import { postgresWorld } from '../world';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function finished(world: World, runId: string, ended: 'RunCompleted' | 'RunFailed' = 'RunCompleted'): Promise<void> {
  await appendEvent(world, runId, { type: 'RunStarted', payload: {} });
  await appendEvent(world, runId, { type: ended, payload: ended === 'RunFailed' ? { error: { message: 'x' } } : {} });
}

describe.each(worldKinds)('deleting and pruning runs on %s', (_name, makeWorld) => {
  it('deletes a run whole: its events, index entries, catalog row and artifacts', async () => {
    const world = makeWorld();
    const art = await writeArtifact(world, { runId: 'run_gone', stepPath: 's', name: 'out', contentType: 'text/plain', encoding: 'utf8', payload: 'hello' });
    await appendEvent(world, 'run_gone', { type: 'RunStarted', payload: { out: art.artifactRef }, index: [{ index: 'by-name', key: 'gone', value: 'v' }] });
    await appendEvent(world, 'run_gone', { type: 'RunCompleted', payload: {} });
    await finished(world, 'run_kept');
    const result = await deleteRun(world, 'run_gone');
    expect(result).toEqual({ runId: 'run_gone', deleted: true, events: 2, artifacts: 1, bytes: 5 });
    expect(await listEvents(world, 'run_gone')).toEqual([]);
    expect((await listRuns(world)).map((r) => r.runId)).toEqual(['run_kept']);
    expect((await queryRuns(world)).runs.map((r) => r.runId)).toEqual(['run_kept']);
    expect(await lookupIndexEntry(world, 'by-name', 'gone')).toBeUndefined();
    expect(await rejection(readArtifact(world, art.artifactId))).toBeInstanceOf(ArtifactNotFoundError);
    expect((await verifyWorld(world)).ok).toBe(true);
    // Nothing is left to delete.
    expect(await deleteRun(world, 'run_gone')).toEqual({ runId: 'run_gone', deleted: false, events: 0, artifacts: 0, bytes: 0 });
    expect((await deleteRun(world, 'ses_never')).deleted).toBe(false);
  });

  it('deletes the streams a run owns with it, and prunes them with it', async () => {
    const world = makeWorld();
    const own = (runId: string) => ({ index: [{ index: 'little.owner', key: runId, value: 'run_owner' }] });
    await appendEvent(world, 'run_owner', { type: 'RunStarted', payload: {} });
    await appendEvent(world, 'run_owner_stream', { type: 'chunk', payload: { n: 1 }, ...own('run_owner_stream') });
    await appendEvent(world, 'run_owner_stream', { type: 'chunk', payload: { n: 2 } });
    await appendEvent(world, 'run_owner_queue', { type: 'message', payload: {}, ...own('run_owner_queue') });
    await finished(world, 'run_other');
    expect(await deleteRun(world, 'run_owner')).toEqual({ runId: 'run_owner', deleted: true, events: 4, artifacts: 0, bytes: 0 });
    expect((await queryRuns(world, { order: 'id' })).runs.map((r) => r.runId)).toEqual(['run_other']);
    expect(await lookupIndexEntry(world, 'little.owner', 'run_owner_stream')).toBeUndefined();
    // A deleted run owns nothing: a stream that names it is refused, and nothing is written.
    const orphan = await rejection(appendEvent(world, 'run_owner_stream', { type: 'chunk', payload: { n: 3 }, ...own('run_owner_stream') }));
    expect(orphan).toBeInstanceOf(EventValidationError);
    expect(orphan.message).toMatch(/owner/);
    expect(await listEvents(world, 'run_owner_stream')).toEqual([]);
    // A prune takes them along too, and counts only the runs it pruned.
    await appendEvent(world, 'run_owner', { type: 'RunStarted', payload: {} });
    await appendEvent(world, 'run_owner', { type: 'RunCompleted', payload: {} });
    await appendEvent(world, 'run_owner_stream', { type: 'chunk', payload: { n: 1 }, ...own('run_owner_stream') });
    const pruned = await pruneRuns(world, { endedBefore: new Date(Date.now() + 60_000) });
    expect(pruned).toMatchObject({ runs: 2, events: 5 });
    expect((await queryRuns(world)).runs).toEqual([]);
    expect((await verifyWorld(world)).ok).toBe(true);
  });

  it('starts a run deleted and appended to again at sequence 1, its idempotency keys gone with it', async () => {
    const world = makeWorld();
    const first = await appendEvent(world, 'run_again', { type: 'harness.note', payload: { n: 1 }, appendIdempotencyKey: 'k' });
    await appendEvent(world, 'run_again', { type: 'note', payload: {} });
    await deleteRun(world, 'run_again');
    const again = await appendEvent(world, 'run_again', { type: 'harness.note', payload: { n: 2 }, appendIdempotencyKey: 'k' });
    expect(again.sequence).toBe(1);
    expect(again.eventId).not.toBe(first.eventId);
    expect((await listEvents(world, 'run_again')).map((e) => e.payload)).toEqual([{ n: 2 }]);
    const [row] = (await queryRuns(world)).runs;
    expect(row).toMatchObject({ runId: 'run_again', eventCount: 1, status: 'pending' });
    expect((await verifyWorld(world)).ok).toBe(true);
  });

  it('ends a subscription of the run it deletes', async () => {
    const world = makeWorld();
    await finished(world, 'run_watched');
    const sub = subscribe(world, 'run_watched');
    expect((await sub.next()).value?.sequence).toBe(1);
    expect((await sub.next()).value?.sequence).toBe(2);
    const waiting = sub.next();
    await deleteRun(world, 'run_watched');
    expect(await waiting).toEqual({ done: true, value: undefined });
  });

  it('keeps an artifact another run refers to', async () => {
    const world = makeWorld();
    const shared = await writeArtifact(world, { runId: 'run_maker', stepPath: 's', name: 'shared', contentType: 'text/plain', encoding: 'utf8', payload: 'shared' });
    const own = await writeArtifact(world, { runId: 'run_maker', stepPath: 's', name: 'own', contentType: 'text/plain', encoding: 'utf8', payload: 'own' });
    await appendEvent(world, 'run_maker', { type: 'note', payload: { a: shared.artifactRef, b: own.artifactRef } });
    await appendEvent(world, 'run_user', { type: 'note', payload: { uses: [shared.artifactRef] } });
    expect(await deleteRun(world, 'run_maker')).toMatchObject({ deleted: true, artifacts: 1, bytes: 3 });
    expect((await readArtifact(world, shared.artifactId)).payload).toBe('shared');
    expect(await rejection(readArtifact(world, own.artifactId))).toBeInstanceOf(ArtifactNotFoundError);
    expect((await verifyWorld(world)).ok).toBe(true);
  });

  it('does not delete a run under the owner of its lock, and lets the owner delete it', async () => {
    const world = makeWorld();
    await finished(world, 'run_locked');
    const lock = await acquireRunLock(world, 'run_locked');
    expect(await rejection(deleteRun(world, 'run_locked'))).toBeInstanceOf(RunLockedError);
    expect((await listEvents(world, 'run_locked')).length).toBe(2);
    // A prune leaves it for later, and says so.
    expect(await pruneRuns(world, { endedBefore: new Date(Date.now() + 60_000) })).toMatchObject({ runs: 0, skipped: 1 });
    expect(await rejection(deleteRun(world, 'run_locked', { lock: { ...lock, name: 'run:run_other' } }))).toBeInstanceOf(EventValidationError);
    expect((await deleteRun(world, 'run_locked', { lock })).deleted).toBe(true);
    await lock.release();
    expect(await listEvents(world, 'run_locked')).toEqual([]);
  });

  it('prunes only the runs that ended before the time given, in a dry run deleting nothing', async () => {
    const world = makeWorld();
    await finished(world, 'run_old_done');
    await finished(world, 'run_old_failed', 'RunFailed');
    await appendEvent(world, 'run_old_running', { type: 'RunStarted', payload: {} });
    await appendEvent(world, 'run_old_pending', { type: 'note', payload: {} });
    await sleep(5);
    const cut = new Date();
    await sleep(5);
    await finished(world, 'run_new_done');
    const dry = await pruneRuns(world, { endedBefore: cut, dryRun: true });
    expect(dry).toEqual({ runs: 2, events: 4, artifacts: 0, bytes: 0, skipped: 0, runIds: ['run_old_done', 'run_old_failed'] });
    expect((await listRuns(world)).length).toBe(5);
    expect(await pruneRuns(world, { endedBefore: cut, statuses: ['failed'] })).toEqual({ runs: 1, events: 2, artifacts: 0, bytes: 0, skipped: 0 });
    expect(await pruneRuns(world, { endedBefore: cut.toISOString(), limit: 5 })).toEqual({ runs: 1, events: 2, artifacts: 0, bytes: 0, skipped: 0 });
    expect((await listRuns(world)).map((r) => r.runId)).toEqual(['run_new_done', 'run_old_pending', 'run_old_running']);
    // However old, a run that has not ended stays.
    expect((await pruneRuns(world, { endedBefore: new Date(Date.now() + 60_000) })).runs).toBe(1);
    expect((await listRuns(world)).map((r) => r.runId)).toEqual(['run_old_pending', 'run_old_running']);
    expect((await verifyWorld(world)).ok).toBe(true);
  });

  it('refuses a prune without endedBefore, or of a status in which runs have not ended', async () => {
    const world = makeWorld();
    await finished(world, 'run_a');
    const bad: unknown[] = [undefined, {}, { endedBefore: 'last week' }, { endedBefore: new Date(), statuses: ['running'] }, { endedBefore: new Date(), statuses: [] }, { endedBefore: new Date(), limit: 0 }];
    for (const opts of bad) {
      const err = await rejection(pruneRuns(world, opts as never)).catch((e: Error) => new Error(`${JSON.stringify(opts)}: ${e.message}`));
      expect(err, JSON.stringify(opts)).toBeInstanceOf(EventValidationError);
    }
    expect((await listRuns(world)).length).toBe(1);
  });

  it('compacts a world after deletions and keeps every remaining run', async () => {
    const world = makeWorld();
    for (let i = 0; i < 40; i++) await appendEvent(world, `run_${i}`, { type: 'RunCompleted', payload: { pad: 'x'.repeat(4000) } });
    expect((await pruneRuns(world, { endedBefore: new Date(Date.now() + 60_000), limit: 30 })).runs).toBe(30);
    await compactWorld(world);
    expect((await listRuns(world)).length).toBe(10);
    expect((await verifyWorld(world)).ok).toBe(true);
    await appendEvent(world, 'run_after', { type: 'note', payload: {} });
    expect((await listEvents(world, 'run_after')).length).toBe(1);
  });
});

describe('deleting and compacting a local world', () => {
  it('gives the freed pages back to the file system when compacted', async () => {
    const dataDir = tempDir();
    const world = track(localWorld({ dataDir }));
    for (let i = 0; i < 200; i++) await appendEvent(world, `run_${i}`, { type: 'RunCompleted', payload: { pad: 'x'.repeat(8000) } });
    const db = join(dataDir, 'events', 'events.db');
    await pruneRuns(world, { endedBefore: new Date(Date.now() + 60_000) });
    await compactWorld(world);
    const after = statSync(db).size;
    expect(after).toBeLessThan(200 * 8000 * 0.1);
    expect((await verifyWorld(world)).ok).toBe(true);
  });

  it('refuses to change a world opened read-only', async () => {
    const dataDir = tempDir();
    const writer = track(localWorld({ dataDir }));
    await finished(writer, 'run_ro');
    const reader = track(localWorld({ dataDir, readOnly: true }));
    for (const p of [deleteRun(reader, 'run_ro'), pruneRuns(reader, { endedBefore: new Date() }), compactWorld(reader)]) {
      expect(await rejection(p)).toBeInstanceOf(WorldPathError);
    }
    expect((await listEvents(writer, 'run_ro')).length).toBe(2);
  });
});

describe('backing up a local world', () => {
  it('copies it while appends go on: the copy opens, verifies, and holds a prefix of each run', async () => {
    const dataDir = tempDir();
    const world = track(localWorld({ dataDir, durability: 'normal' }));
    const art = await writeArtifact(world, { runId: 'run_0', stepPath: 's', name: 'a', contentType: 'text/plain', encoding: 'utf8', payload: 'kept' });
    await appendEvent(world, 'run_0', { type: 'note', payload: { a: art.artifactRef } });
    let writing = true;
    const writer = (async () => {
      for (let i = 0; writing; i++) await appendEvent(world, `run_${i % 5}`, { type: 'note', payload: { i } });
    })();
    const stop = () => {
      writing = false;
      return writer;
    };
    await sleep(20);
    const to = join(tempDir(), 'backup');
    await backupWorld(world, to).finally(stop);
    const copy = track(localWorld({ dataDir: to, readOnly: true }));
    expect((await verifyWorld(copy)).ok).toBe(true);
    for (const run of await listRuns(copy)) {
      const copied = await listEvents(copy, run.runId);
      const source = await listEvents(world, run.runId);
      expect(copied).toEqual(source.slice(0, copied.length));
    }
    expect((await readArtifact(copy, art.artifactId)).payload).toBe('kept');
    // A second backup into the same directory is refused; so is a world with nothing on disk.
    expect(await rejection(backupWorld(world, to))).toBeInstanceOf(WorldPathError);
    expect(await rejection(backupWorld(track(virtualWorld()), join(tempDir(), 'b')))).toBeInstanceOf(WorldPathError);
    expect(existsSync(join(to, 'events', 'events.db'))).toBe(true);
  });
});

describe('a run deleted by another process', () => {
  const pairs: Array<[string, () => [World, World]]> = [
    [
      'localWorld',
      () => {
        const dataDir = tempDir();
        return [track(localWorld({ dataDir })), track(localWorld({ dataDir }))];
      },
    ],
  ];
  if (needsPostgres()) {
    pairs.push([
      'postgresWorld',
      () => {
        const schema = freshSchema();
        const open = () => track(postgresWorld({ connectionString: postgresUrl()!, schema }));
        return [open(), open()];
      },
    ]);
  }
  it.each(pairs)('starts again at sequence 1 for a writer that remembered it (%s)', async (_kind, open) => {
    const [a, b] = open();
    await appendEvent(a, 'run_shared', { type: 'note', payload: { n: 1 } });
    await appendEvent(a, 'run_shared', { type: 'note', payload: { n: 2 } });
    expect((await deleteRun(b, 'run_shared')).events).toBe(2);
    // `a` remembers the run at sequence 2; its next append must not leave a hole at 1 and 2.
    expect((await appendEvent(a, 'run_shared', { type: 'note', payload: { n: 3 } })).sequence).toBe(1);
    expect((await listEvents(b, 'run_shared')).map((e) => [e.sequence, e.payload])).toEqual([[1, { n: 3 }]]);
    expect((await verifyWorld(b)).ok).toBe(true);
  });
});

describe('a prune killed at any moment', () => {
  it.each(durableKinds())('leaves each run whole or gone, verify ok, and finishes when run again (%s)', async (_kind, target) => {
    const { where, open } = target();
    let world = open();
    const RUNS = 600;
    const made: Array<[string, string]> = [];
    const batch: Promise<unknown>[] = [];
    for (let i = 0; i < RUNS; i++) {
      const runId = `run_${String(i).padStart(4, '0')}`;
      batch.push(
        (async () => {
          const payload: Record<string, unknown> = { i };
          if (i % 10 === 0) {
            const art = await writeArtifact(world, { runId, stepPath: 's', name: 'a', contentType: 'text/plain', encoding: 'utf8', payload: `artifact ${i}` });
            payload.a = art.artifactRef;
            made.push([runId, art.artifactId]);
          }
          await appendEvent(world, runId, { type: 'RunStarted', payload });
          await appendEvent(world, runId, { type: 'note', payload: { i } });
          await appendEvent(world, runId, { type: 'RunCompleted', payload: {} });
        })(),
      );
    }
    await Promise.all(batch);
    // One run still going, which no prune deletes.
    await appendEvent(world, 'run_going', { type: 'RunStarted', payload: {} });
    await world.close();
    let finished = false;
    for (const afterMs of [5, 40, 120]) {
      finished = await killedChild('prune-child.cjs', [where], 'pruning', afterMs);
      world = open();
      try {
        expect((await verifyWorld(world)).problems).toEqual([]);
        for (const run of await listRuns(world)) {
          const events = await listEvents(world, run.runId);
          expect(events.length, run.runId).toBe(run.runId === 'run_going' ? 1 : 3);
        }
      } finally {
        await world.close();
      }
      if (finished) break;
    }
    world = track(open());
    // A run whose lock the killed process held is left (and counted) until that lock is free.
    for (let tries = 0; ; tries++) {
      const r = await pruneRuns(world, { endedBefore: new Date(Date.now() + 3_600_000) });
      if (r.skipped === 0 || tries > 60) break;
      await sleep(500);
    }
    expect((await listRuns(world)).map((r) => r.runId)).toEqual(['run_going']);
    expect((await verifyWorld(world)).ok).toBe(true);
    // A kill between a batch's commit and the removal of its artifacts leaves artifacts that no
    // event refers to (verify stays ok); deleting their runs again removes them.
    // The killed process may still hold such a run's lock until its lease runs out.
    const deleteWhenFree = async (runId: string) => {
      for (let tries = 0; ; tries++) {
        try {
          return await deleteRun(world, runId);
        } catch (err) {
          if (!(err instanceof RunLockedError) || tries > 60) throw err;
          await sleep(500);
        }
      }
    };
    for (const [runId, id] of made) {
      if (await readArtifact(world, id).then(() => true, () => false)) await deleteWhenFree(runId);
      expect(await rejection(readArtifact(world, id))).toBeInstanceOf(ArtifactNotFoundError);
    }
    expect((await verifyWorld(world)).ok).toBe(true);
  }, 120_000);
});
