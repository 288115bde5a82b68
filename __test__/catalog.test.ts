// The runs catalog, on every world kind: `queryRuns` pages, its filters and orders, the statuses
// it keeps at commit against the folds', `listRuns` read from it, `little verify`'s check of it,
// and the upgrade of a world written before it.
import Database from 'better-sqlite3';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  appendEvent,
  appendRunEvent,
  appendSessionEvent,
  EventValidationError,
  foldRunEvents,
  listRunEvents,
  listRuns,
  localWorld,
  materializeRunState,
  queryRuns,
  verifyWorld,
  type RunEventDraft,
  type RunSummary,
  type World,
} from '../world';
import { freshSchema, needsPostgres, postgresUrl, rejection, SCHEMA_VERSION, schemaVersion, tempDir, track, withPg, worldKinds } from './helpers';
import { postgresWorld } from '../world';

const UUID = '00000000-0000-4000-8000-000000000000';
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Every page of `queryRuns` with these options, concatenated. */
async function allPages(world: World, opts: Parameters<typeof queryRuns>[1] = {}): Promise<RunSummary[]> {
  const out: RunSummary[] = [];
  let cursor: string | undefined;
  for (let pages = 0; pages < 1000; pages++) {
    const page = await queryRuns(world, { ...opts, ...(cursor === undefined ? {} : { cursor }) });
    out.push(...page.runs);
    if (page.cursor === null) return out;
    cursor = page.cursor;
  }
  throw new Error('queryRuns never reached its last page');
}

/** Runs of each status the catalog knows, a few milliseconds apart. */
async function someRuns(world: World): Promise<void> {
  const k = (s: string) => ({ appendIdempotencyKey: s });
  await appendEvent(world, 'run_done', { type: 'RunStarted', payload: {} });
  await appendEvent(world, 'run_done', { type: 'RunCompleted', payload: { output: 1 } });
  await sleep(3);
  await appendEvent(world, 'run_failed', { type: 'RunStarted', payload: {} });
  await appendEvent(world, 'run_failed', { type: 'RunFailed', payload: { error: { message: 'x' } } });
  await sleep(3);
  await appendEvent(world, 'run_stepping', { type: 'StepStarted', payload: { stepPath: 'a' } });
  await sleep(3);
  await appendEvent(world, 'run_idle', { type: 'note', payload: {} });
  await sleep(3);
  await appendRunEvent(world, 'run_graph', { type: 'run:started', workflowId: UUID, inputs: {}, executionMode: 'local' });
  await appendRunEvent(world, 'run_graph', { type: 'human_gate:paused', nodeId: 'a', gateId: 'g', gateType: 'approval', message: 'ok?' } as unknown as RunEventDraft);
  await sleep(3);
  await appendSessionEvent(world, 'ses_open', { type: 'session:turn_started' });
  await sleep(3);
  await appendEvent(world, 'run_sdk', { type: 'workflow.run_created', payload: {} });
  await appendEvent(world, 'run_sdk', { type: 'workflow.run_started', payload: {} });
  await appendEvent(world, 'run_sdk', { type: 'workflow.run_cancelled', payload: {}, ...k('c') });
}

describe.each(worldKinds)('runs catalog on %s', (_name, makeWorld) => {
  it('pages every run once, newest first by default, each with the status its events give', async () => {
    const world = makeWorld();
    await someRuns(world);
    const statuses = Object.fromEntries((await listRuns(world)).map((r) => [r.runId, r.status]));
    expect(statuses).toEqual({
      run_done: 'completed',
      run_failed: 'failed',
      run_stepping: 'running',
      run_idle: 'pending',
      run_graph: 'paused',
      ses_open: 'open',
      run_sdk: 'cancelled',
    });
    const pages: RunSummary[][] = [];
    let cursor: string | undefined;
    do {
      const page = await queryRuns(world, { limit: 3, ...(cursor === undefined ? {} : { cursor }) });
      pages.push([...page.runs]);
      cursor = page.cursor ?? undefined;
    } while (cursor !== undefined);
    expect(pages.map((p) => p.length)).toEqual([3, 3, 1]);
    const newest = pages.flat().map((r) => r.runId);
    expect(newest).toEqual(['run_sdk', 'ses_open', 'run_graph', 'run_idle', 'run_stepping', 'run_failed', 'run_done']);
    expect((await allPages(world, { order: 'oldest', limit: 2 })).map((r) => r.runId)).toEqual([...newest].reverse());
    expect((await allPages(world, { order: 'id', limit: 4 })).map((r) => r.runId)).toEqual([...newest].sort());
    // A page's rows are listRuns' rows.
    const listed = await listRuns(world);
    expect(await allPages(world, { order: 'id', limit: 5 })).toEqual(listed);
    const done = listed.find((r) => r.runId === 'run_done')!;
    expect(done).toMatchObject({ eventCount: 2, lastSequence: 2, status: 'completed' });
    expect(done.firstRecordedAt <= done.lastRecordedAt).toBe(true);
  });

  it('filters by status and by the time of the last event', async () => {
    const world = makeWorld();
    await someRuns(world);
    const ended = await allPages(world, { status: ['failed', 'completed', 'cancelled'], limit: 2 });
    expect(ended.map((r) => r.runId)).toEqual(['run_sdk', 'run_failed', 'run_done']);
    expect((await queryRuns(world, { status: ['nothing'] })).runs).toEqual([]);
    const all = await allPages(world, { order: 'oldest' });
    const cut = all[3]!.lastRecordedAt;
    const before = await allPages(world, { lastRecordedBefore: cut, order: 'oldest' });
    expect(before.every((r) => r.lastRecordedAt < cut)).toBe(true);
    const after = await allPages(world, { lastRecordedAfter: new Date(cut), order: 'oldest' });
    expect(after.every((r) => r.lastRecordedAt >= cut)).toBe(true);
    expect(before.length + after.length).toBe(all.length);
    const both = await allPages(world, { status: ['completed', 'failed'], lastRecordedBefore: all[1]!.lastRecordedAt });
    expect(both.map((r) => r.runId)).toEqual(['run_done']);
  });

  it('keeps a run on its page order as it grows, and its status as it changes', async () => {
    const world = makeWorld();
    await appendEvent(world, 'run_a', { type: 'RunStarted', payload: {} });
    await sleep(3);
    await appendEvent(world, 'run_b', { type: 'RunStarted', payload: {} });
    expect((await queryRuns(world)).runs.map((r) => r.runId)).toEqual(['run_b', 'run_a']);
    await sleep(3);
    await appendEvent(world, 'run_a', { type: 'RunCompleted', payload: {} });
    const page = await queryRuns(world);
    expect(page.runs.map((r) => [r.runId, r.status, r.eventCount])).toEqual([
      ['run_a', 'completed', 2],
      ['run_b', 'running', 1],
    ]);
    expect(page.cursor).toBeNull();
    expect((await queryRuns(world, { status: ['running'] })).runs.map((r) => r.runId)).toEqual(['run_b']);
    expect((await verifyWorld(world)).ok).toBe(true);
  });

  it('agrees with the folds on every run-event type and every step of a run', async () => {
    const world = makeWorld();
    const drafts: RunEventDraft[] = [
      { type: 'run:started', workflowId: UUID, inputs: {}, executionMode: 'local' },
      { type: 'node:started', nodeId: 'a', nodeType: 'agent' },
      { type: 'human_gate:paused', nodeId: 'a', gateId: 'g', gateType: 'approval', message: 'ok?' } as unknown as RunEventDraft,
      { type: 'run:timeout', elapsedMs: 5, timeoutMs: 1 } as unknown as RunEventDraft,
      { type: 'human_gate:resumed', nodeId: 'a', decision: 'approved', decidedBy: 'ana' } as unknown as RunEventDraft,
      { type: 'run:timeout', elapsedMs: 5, timeoutMs: 1 } as unknown as RunEventDraft,
      { type: 'run:completed', durationMs: 5, outputs: {}, totalCostMicrocents: 0, totalTokensUsed: { input: 0, output: 0 } } as unknown as RunEventDraft,
    ];
    for (const d of drafts) {
      try {
        await appendRunEvent(world, 'run_x', d);
      } catch (e) {
        throw new Error(`${d.type}: ${String(e)}`);
      }
      const fold = foldRunEvents(await listRunEvents(world, 'run_x')) as { status: string };
      const [row] = (await queryRuns(world, { order: 'id' })).runs;
      expect(row!.status).toBe(fold.status);
    }
    const harness: Array<[string, Record<string, unknown>]> = [
      ['StepStarted', { stepPath: 'a' }],
      ['OuterLoopCycleCompleted', { outerLoopId: 'o', cycleNumber: 1, supervise: { kind: 'continue' } }],
      ['RunStarted', {}],
      ['RunCompleted', {}],
      ['StepFailed', { stepPath: 'a', error: { message: 'x' } }],
      ['RunStarted', {}],
      ['OuterLoopCycleCompleted', { outerLoopId: 'o', cycleNumber: 2, supervise: { kind: 'done' } }],
    ];
    for (const [type, payload] of harness) {
      await appendEvent(world, 'run_h', { type, payload });
      const state = await materializeRunState(world, 'run_h');
      const row = (await queryRuns(world, { order: 'id' })).runs.find((r) => r.runId === 'run_h')!;
      expect([type, row.status]).toEqual([type, state.status]);
    }
    expect((await verifyWorld(world)).ok).toBe(true);
  });

  it('refuses bad options with a typed error', async () => {
    const world = makeWorld();
    await appendEvent(world, 'run_a', { type: 'note', payload: {} });
    await appendEvent(world, 'run_b', { type: 'note', payload: {} });
    const page = await queryRuns(world, { limit: 1 });
    expect(page.cursor).not.toBeNull();
    const bad: Array<Parameters<typeof queryRuns>[1]> = [
      { limit: 0 },
      { limit: 10_001 },
      { limit: 1.5 },
      { status: [] },
      { order: 'sideways' as 'id' },
      { lastRecordedBefore: 'yesterday' },
      { lastRecordedAfter: new Date(Number.NaN) },
      { cursor: 'not a cursor' },
      { cursor: page.cursor!, order: 'id' },
    ];
    for (const opts of bad) {
      const err = await rejection(queryRuns(world, opts)).catch((e: Error) => new Error(`${JSON.stringify(opts)}: ${e.message}`));
      expect(err, JSON.stringify(opts)).toBeInstanceOf(EventValidationError);
    }
    expect((await queryRuns(world, { limit: 1, cursor: page.cursor! })).runs.map((r) => r.runId)).toEqual(['run_a']);
  });
});

describe('runs catalog of a local world', () => {
  it('is reported by verify when a row disagrees with its events', async () => {
    const dataDir = tempDir();
    let world = localWorld({ dataDir });
    await appendEvent(world, 'run_a', { type: 'RunStarted', payload: {} });
    await appendEvent(world, 'run_b', { type: 'RunStarted', payload: {} });
    expect((await verifyWorld(world)).ok).toBe(true);
    await world.close();
    const db = new Database(join(dataDir, 'events', 'events.db'));
    db.prepare("UPDATE runs SET status = 'completed' WHERE run_id = 'run_a'").run();
    db.prepare("DELETE FROM runs WHERE run_id = 'run_b'").run();
    db.prepare("INSERT INTO runs VALUES ('run_ghost', 1, 't', 't', 'pending')").run();
    db.close();
    world = track(localWorld({ dataDir, readOnly: true }));
    const report = await verifyWorld(world);
    expect(report.ok).toBe(false);
    expect(report.problems.map((p) => [p.kind, p.runId])).toEqual([
      ['catalog', 'run_a'],
      ['catalog', 'run_b'],
      ['catalog', 'run_ghost'],
    ]);
  });

  it('is filled in when a world written before it is opened', async () => {
    const dataDir = tempDir();
    let world = localWorld({ dataDir });
    await someRuns(world);
    const before = await listRuns(world);
    await world.close();
    // The world as the version before the catalog left it: no `runs` table, schema 6.
    const db = new Database(join(dataDir, 'events', 'events.db'));
    db.exec(`DROP TABLE runs;
      DROP TRIGGER events_writer;
      CREATE TRIGGER events_writer BEFORE INSERT ON events WHEN NOT little_world_writer(6)
      BEGIN SELECT RAISE(ABORT, 'upgraded'); END;`);
    db.pragma('user_version = 6');
    db.close();
    // Opened read-only, it is not upgraded, and its runs are worked out from its events.
    const reader = track(localWorld({ dataDir, readOnly: true }));
    expect(await listRuns(reader)).toEqual(before);
    expect((await queryRuns(reader, { status: ['failed'] })).runs.map((r) => r.runId)).toEqual(['run_failed']);
    expect((await verifyWorld(reader)).ok).toBe(true);
    await reader.close();
    expect(schemaVersion(dataDir)).toBe(6);
    world = track(localWorld({ dataDir }));
    expect(await listRuns(world)).toEqual(before);
    expect(schemaVersion(dataDir)).toBe(SCHEMA_VERSION);
    expect((await allPages(world, { status: ['cancelled'] })).map((r) => r.runId)).toEqual(['run_sdk']);
    expect((await verifyWorld(world)).ok).toBe(true);
  });
});

describe.runIf(needsPostgres())('runs catalog of a PostgreSQL world', () => {
  it('is filled in when a schema written before it is opened', async () => {
    const schema = freshSchema();
    const open = () => track(postgresWorld({ connectionString: postgresUrl()!, schema }));
    let world = open();
    await someRuns(world);
    const before = await listRuns(world);
    await world.close();
    // The schema as the version before the catalog left it.
    await withPg((c) =>
      c.query(`DROP TABLE "${schema}".artifact_objects; DROP INDEX "${schema}".runs_by_time; DROP INDEX "${schema}".runs_by_status;
        ALTER TABLE "${schema}".runs DROP CONSTRAINT runs_last_sequence_known, DROP COLUMN status, DROP COLUMN written_after;
        UPDATE "${schema}".world_schema SET version = 3`),
    );
    world = open();
    expect(await listRuns(world)).toEqual(before);
    expect((await allPages(world, { status: ['cancelled', 'paused'] })).map((r) => r.runId)).toEqual(['run_sdk', 'run_graph']);
    expect((await verifyWorld(world)).ok).toBe(true);
  });
});
