// The Vercel World on each SDK line it serves. The line of the app's `@workflow/world` decides
// the interface (spec versions from its own constants); the 4.x line calls World-level stream
// methods with `(name, runId)` arguments and reads a step by its id alone; the 5.x beta has
// slot-numbered event ids, reports the events a stale writer missed, and may call optional reads,
// deduplicated hook resumes and inline deltas. Also: an empty cursor, and a PostgreSQL world
// named by the environment.
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import * as sdk from '@workflow/world';
import * as beta from '@workflow/world-beta';
import { describe, expect, it } from 'vitest';
import { createWorld } from '@little-workflow/world/vercel';
import { appendEvent, listEvents, localWorld, postgresWorld, type World } from '@little-workflow/world';
import { lineOf } from '../lib/vercel/line.js';
import { createEvent } from '../lib/vercel/decide.js';
import { RunCache } from '../lib/vercel/runs.js';
import { createStorage } from '../lib/vercel/storage.js';
import { createWorldLevelStreams } from '../lib/vercel/streams.js';
import { freshSchema, needsPostgres, postgresUrl, tempDir } from './helpers';

async function text(stream: ReadableStream<Uint8Array>): Promise<string[]> {
  const out: string[] = [];
  for await (const chunk of stream as unknown as AsyncIterable<Uint8Array>) out.push(Buffer.from(chunk).toString('utf8'));
  return out;
}

describe('the line of the installed @workflow/world', () => {
  it("declares the installed package's own spec version and keeps its streams under world.streams", () => {
    const world = createWorld({ dataDir: tempDir() });
    try {
      expect(world.specVersion).toBe(sdk.SPEC_VERSION_CURRENT);
      expect(typeof world.streams.write).toBe('function');
      expect((world as unknown as Record<string, unknown>).writeToStream).toBeUndefined();
    } finally {
      void world.close();
    }
  });

  it('reads a 4.x line (spec 3, no attributes, no slots) as one with World-level streams', () => {
    const line = lineOf({ SPEC_VERSION_CURRENT: 3 }, '4.5.0');
    expect(line.minted()).toBe(3);
    expect(line.maxReadable).toBe(3);
    expect(line.worldLevelStreams).toBe(true);
    expect(line.slots).toBeUndefined();
    expect(line.validateAttributeChanges).toBeUndefined();
  });

  it("reads a line with slot ids from its own constants and helper, minting what the line's mintedSpecVersion says", () => {
    const eventId = (n: number) => `evnt_${String(n).padStart(26, '0')}`;
    let minted = 7;
    const line = lineOf(
      { SPEC_VERSION_CURRENT: 7, SPEC_VERSION_MAX_SUPPORTED: 7, SPEC_VERSION_SUPPORTS_SLOT_IDENTITY: 6, mintedSpecVersion: () => minted, slotToEventId: eventId },
      '5.0.0-beta.37',
    );
    expect(line.worldLevelStreams).toBe(false);
    expect(line.minted()).toBe(7);
    minted = 6;
    expect(line.minted()).toBe(6);
    expect(line.slots?.fromSpecVersion).toBe(6);
    expect(line.slots?.eventId(3)).toBe(eventId(3));
  });

  it('refuses a module without SPEC_VERSION_CURRENT', () => {
    expect(() => lineOf({}, '1.0.0')).toThrow(/SPEC_VERSION_CURRENT/);
  });
});

/** Runs with an event each, as a stream's owner must be. */
async function runsExist(world: World, ...runIds: string[]): Promise<void> {
  for (const runId of runIds) await appendEvent(world, `run_${runId}`, { type: 'test.run', payload: {} });
}

describe("the 4.x line's World-level streams", () => {
  it('writes, closes and reads a stream by its name, lists it by run, and pages and counts its chunks', async () => {
    const world = localWorld({ dataDir: tempDir() });
    try {
      const s = createWorldLevelStreams(world);
      await runsExist(world, 'wrun_1', 'wrun_2');
      const name = 'strm_01ABC_user';
      await s.writeToStream(name, Promise.resolve('wrun_1'), 'a');
      await s.writeToStreamMulti(name, 'wrun_1', ['b', new TextEncoder().encode('c')]);
      expect(await s.getStreamInfo(name, 'wrun_1')).toEqual({ tailIndex: 2, done: false });
      await s.closeStream(name, 'wrun_1');
      await s.writeToStream('strm_other', 'wrun_2', 'z');
      expect(await text(await s.readFromStream(name))).toEqual(['a', 'b', 'c']);
      expect(await text(await s.readFromStream(name, -1))).toEqual(['c']);
      expect(await text(await s.readFromStream(name, 1))).toEqual(['b', 'c']);
      expect(await s.listStreamsByRunId('wrun_1')).toEqual([name]);
      expect(await s.listStreamsByRunId('wrun_2')).toEqual(['strm_other']);
      const first = await s.getStreamChunks(name, 'wrun_1', { limit: 2 });
      expect(first.data.map((c) => Buffer.from(c.data).toString())).toEqual(['a', 'b']);
      expect(first.hasMore).toBe(true);
      const rest = await s.getStreamChunks(name, 'wrun_1', { limit: 2, cursor: first.cursor as string });
      expect(rest.data.map((c) => [c.index, Buffer.from(c.data).toString()])).toEqual([[2, 'c']]);
      expect(rest.done).toBe(true);
      expect(await s.getStreamInfo(name, 'wrun_1')).toEqual({ tailIndex: 2, done: true });
    } finally {
      await world.close();
    }
  });

  it('follows a stream another writer is still writing, live', async () => {
    const world = localWorld({ dataDir: tempDir() });
    try {
      const s = createWorldLevelStreams(world);
      await runsExist(world, 'wrun_1');
      const reading = s.readFromStream('strm_live').then(text);
      await s.writeToStream('strm_live', 'wrun_1', 'x');
      await s.writeToStream('strm_live', 'wrun_1', 'y');
      await s.closeStream('strm_live', 'wrun_1');
      expect(await reading).toEqual(['x', 'y']);
    } finally {
      await world.close();
    }
  });
});

describe('steps.get without a run', () => {
  it("finds a step by its id alone, and says 404 for one no run has", async () => {
    const world = createWorld({ dataDir: tempDir() });
    try {
      const created = await world.events.create(null, { eventType: 'run_created', eventData: { deploymentId: 'd', workflowName: 'wf', input: new Uint8Array([1]) } } as never);
      const runId = (created as { run: { runId: string } }).run.runId;
      await world.events.create(runId, { eventType: 'run_started' } as never);
      await world.events.create(runId, { eventType: 'step_created', correlationId: 'step_x', eventData: { stepName: 's', input: new Uint8Array([2]) } } as never);
      const step = await world.steps.get(undefined as unknown as string, 'step_x');
      expect(step.runId).toBe(runId);
      expect(step.stepName).toBe('s');
      await expect(world.steps.get(undefined as unknown as string, 'step_none')).rejects.toMatchObject({ name: 'WorkflowWorldError', status: 404 });
    } finally {
      await world.close();
    }
  });
});

const betaVersion = (JSON.parse(readFileSync(join(dirname(require.resolve('@workflow/world-beta')), '..', 'package.json'), 'utf8')) as { version: string }).version;

/** The Vercel World's storage on a local world, serving the 5.x beta line. */
function betaStorage() {
  const world = localWorld({ dataDir: tempDir() });
  const cache = new RunCache(world, lineOf(beta as unknown as Record<string, unknown>, betaVersion));
  const storage = createStorage(world, cache);
  type Result = { event: { eventId: string; eventType: string }; events?: { eventId: string; eventType: string }[]; cursor?: string | null; hasMore?: boolean; run?: { runId: string; specVersion?: number } };
  const create = (runId: string | null, data: Record<string, unknown>, params?: Record<string, unknown>) => createEvent(cache, world, runId, data as never, params as never) as Promise<unknown> as Promise<Result>;
  const ids = async (runId: string) => (await storage.events.list({ runId, pagination: { limit: 1000 } })).data.map((e) => e.eventId);
  return { world, storage, create, ids };
}

describe('slot-numbered event ids on the 5.x beta line', () => {
  it("numbers a new run's SDK events densely from 1 with the line's helper, one position per SDK event, and finds each by its id", async () => {
    const { world, storage, create, ids } = betaStorage();
    try {
      // A run_started that creates its run, and a step_started that creates its step: two SDK events each.
      const started = await create('wrun_slots', { eventType: 'run_started', eventData: { deploymentId: 'd', workflowName: 'wf', input: new Uint8Array([1]) } });
      expect(started.run?.specVersion).toBe(beta.mintedSpecVersion());
      await create('wrun_slots', { eventType: 'step_started', correlationId: 'step_1', eventData: { stepName: 's', input: new Uint8Array([2]) } });
      await create('wrun_slots', { eventType: 'step_completed', correlationId: 'step_1', eventData: { result: new Uint8Array([3]) } });
      const listed = await ids('wrun_slots');
      expect(listed).toEqual([1, 2, 3, 4, 5].map((n) => beta.slotToEventId(n)));
      expect(listed.map((id) => beta.eventIdToSlot(id))).toEqual([1, 2, 3, 4, 5]);
      expect((await storage.events.get('wrun_slots', beta.slotToEventId(3))).eventType).toBe('step_created');
      // Each SDK event is an envelope of its own, the two of each creating event committed together.
      const envelopes = await listEvents(world, 'run_wrun_slots');
      expect(envelopes.map((e) => e.type)).toEqual(['run_created', 'run_started', 'step_created', 'step_started', 'step_completed'].map((t) => `workflow.${t}`));
      expect(envelopes[0].recordedAt).toBe(envelopes[1].recordedAt);
      for (const e of envelopes) expect(e.payload).not.toHaveProperty('created');
    } finally {
      await world.close();
    }
  });

  it('mints spec 6 runs, still with slot ids, when WORKFLOW_SEALED_LOG=0 switches the sealed log off', async () => {
    const { world, create, ids } = betaStorage();
    const prior = process.env.WORKFLOW_SEALED_LOG;
    process.env.WORKFLOW_SEALED_LOG = '0';
    try {
      const created = await create('wrun_six', { eventType: 'run_created', eventData: { deploymentId: 'd', workflowName: 'wf', input: new Uint8Array([1]) } });
      expect(created.run?.specVersion).toBe(beta.SPEC_VERSION_SUPPORTS_SLOT_IDENTITY);
      await create('wrun_six', { eventType: 'run_started' });
      expect(await ids('wrun_six')).toEqual([beta.slotToEventId(1), beta.slotToEventId(2)]);
    } finally {
      if (prior === undefined) delete process.env.WORKFLOW_SEALED_LOG;
      else process.env.WORKFLOW_SEALED_LOG = prior;
      await world.close();
    }
  });

  it('keeps the ids of a run created at a spec version before slots', async () => {
    const { world, create, ids } = betaStorage();
    try {
      await create('wrun_old', { eventType: 'run_created', specVersion: beta.SPEC_VERSION_SUPPORTS_COMPRESSION, eventData: { deploymentId: 'd', workflowName: 'wf', input: new Uint8Array([1]) } });
      await create('wrun_old', { eventType: 'run_started' });
      const listed = await ids('wrun_old');
      expect(listed).toHaveLength(2);
      for (const id of listed) expect(beta.isSlotEventId(id)).toBe(false);
    } finally {
      await world.close();
    }
  });

  it("commits a writer's stale eventCount at the next free position and reports the events it had not seen", async () => {
    const { world, create } = betaStorage();
    try {
      await create('wrun_stale', { eventType: 'run_created', eventData: { deploymentId: 'd', workflowName: 'wf', input: new Uint8Array([1]) } });
      await create('wrun_stale', { eventType: 'run_started' });
      await create('wrun_stale', { eventType: 'wait_created', correlationId: 'wait_1', eventData: { resumeAt: new Date() } });
      // The writer had seen two events; a third was written meanwhile.
      const late = await create('wrun_stale', { eventType: 'step_created', correlationId: 'step_1', eventData: { stepName: 's', input: new Uint8Array([2]) } }, { eventCount: 2 });
      expect(late.event.eventId).toBe(beta.slotToEventId(4));
      expect(late.events?.map((e) => [e.eventId, e.eventType])).toEqual([[beta.slotToEventId(3), 'wait_created']]);
      expect(late.cursor).toBe(beta.slotToEventId(3));
      expect(late.hasMore).toBe(false);
      // A writer that had seen everything is told nothing more.
      const current = await create('wrun_stale', { eventType: 'step_created', correlationId: 'step_2', eventData: { stepName: 's', input: new Uint8Array([3]) } }, { eventCount: 4 });
      expect(current.event.eventId).toBe(beta.slotToEventId(5));
      expect(current.events).toBeUndefined();
    } finally {
      await world.close();
    }
  });
});

describe('createBatch on the 5.x beta line', () => {
  type BatchResult = { status: number; error?: string; event?: { eventId: string; eventType: string }; step?: { status: string; attempt: number }; wait?: { status: string } };
  const batch = (storage: ReturnType<typeof betaStorage>['storage'], runId: string, events: Record<string, unknown>[]) =>
    (storage.events as unknown as { createBatch: (r: string, e: unknown[]) => Promise<{ results: BatchResult[] }> }).createBatch(runId, events.map((event) => ({ event })));

  it("commits a fan-out at consecutive slots, each event answered as its own create would be, a step's pair born running", async () => {
    const { world, storage, create, ids } = betaStorage();
    try {
      await create('wrun_batch', { eventType: 'run_created', eventData: { deploymentId: 'd', workflowName: 'wf', input: new Uint8Array([1]) } });
      await create('wrun_batch', { eventType: 'run_started' });
      await create('wrun_batch', { eventType: 'step_created', correlationId: 'step_0', eventData: { stepName: 's', input: new Uint8Array([0]) } });
      const { results } = await batch(storage, 'wrun_batch', [
        { eventType: 'step_created', correlationId: 'step_1', eventData: { stepName: 's', input: new Uint8Array([1]) } },
        // Created before: refused as its own create would be, while the rest commit.
        { eventType: 'step_created', correlationId: 'step_0', eventData: { stepName: 's', input: new Uint8Array([0]) } },
        { eventType: 'step_created', correlationId: 'step_2', eventData: { stepName: 's', input: new Uint8Array([2]) } },
        // The runtime's pre-claimed inline pair: the start names the step and its owner, without an input.
        { eventType: 'step_started', correlationId: 'step_2', eventData: { stepName: 's', ownerMessageId: 'msg_1' } },
        { eventType: 'wait_created', correlationId: 'wait_1', eventData: { resumeAt: new Date(Date.now() + 60_000) } },
      ]);
      expect(results.map((r) => r.status)).toEqual([200, 409, 200, 200, 200]);
      expect(results[1].error).toBe('EntityConflictError');
      expect(results.map((r) => r.event?.eventId)).toEqual([beta.slotToEventId(4), undefined, beta.slotToEventId(5), beta.slotToEventId(6), beta.slotToEventId(7)]);
      expect(results[3].step).toMatchObject({ status: 'running', attempt: 1 });
      expect(results[4].wait).toMatchObject({ status: 'waiting' });
      expect(await ids('wrun_batch')).toEqual([1, 2, 3, 4, 5, 6, 7].map((n) => beta.slotToEventId(n)));
      const envelopes = await listEvents(world, 'run_wrun_batch');
      expect(new Set(envelopes.slice(3).map((e) => e.recordedAt)).size).toBe(1);
    } finally {
      await world.close();
    }
  });

  it('refuses, writing nothing, a batch the SDK leaves to create: a type it names, two events for one entity, a paired start with a payload', async () => {
    const { world, storage, create, ids } = betaStorage();
    try {
      await create('wrun_refused', { eventType: 'run_created', eventData: { deploymentId: 'd', workflowName: 'wf', input: new Uint8Array([1]) } });
      const refusals = [
        [{ eventType: 'step_created', correlationId: 'step_1', eventData: { stepName: 's', input: 1 } }, { eventType: 'hook_created', correlationId: 'hook_1', eventData: { token: 't' } }],
        [{ eventType: 'wait_created', correlationId: 'wait_1', eventData: { resumeAt: new Date() } }, { eventType: 'wait_completed', correlationId: 'wait_1' }],
        [{ eventType: 'step_created', correlationId: 'step_1', eventData: { stepName: 's', input: 1 } }, { eventType: 'step_started', correlationId: 'step_1', eventData: { input: 1 } }],
        [],
      ];
      for (const events of refusals) await expect(batch(storage, 'wrun_refused', events)).rejects.toMatchObject({ name: 'WorkflowWorldError', status: 400 });
      expect(await ids('wrun_refused')).toEqual([beta.slotToEventId(1)]);
    } finally {
      await world.close();
    }
  });
});

describe('the optional run reads the 5.x beta may call', () => {
  async function started(world: ReturnType<typeof createWorld>) {
    const created = await world.events.create(null, { eventType: 'run_created', eventData: { deploymentId: 'd', workflowName: 'wf', input: new Uint8Array([1]) } } as never);
    const runId = (created as { run: { runId: string } }).run.runId;
    await world.events.create(runId, { eventType: 'run_started' } as never);
    return runId;
  }
  type Runs = {
    getMany(ids: string[]): Promise<({ runId: string } | null)[]>;
    waitForTerminalStatus(id: string, params?: { timeoutMs?: number; signal?: AbortSignal }): Promise<{ status: string }>;
    list(params: { status: string[] }): Promise<{ data: { runId: string }[] }>;
  };

  it('gets several runs at once, null for a missing one; lists by a set of statuses', async () => {
    const world = createWorld({ dataDir: tempDir() });
    try {
      const runs = world.runs as unknown as Runs;
      const a = await started(world);
      const b = await started(world);
      await world.events.create(b, { eventType: 'run_completed', eventData: { output: new Uint8Array([2]) } } as never);
      expect((await runs.getMany([a, 'wrun_missing', b])).map((r) => r?.runId ?? null)).toEqual([a, null, b]);
      expect((await runs.list({ status: [] })).data).toEqual([]);
      expect((await runs.list({ status: ['completed'] })).data.map((r) => r.runId)).toEqual([b]);
      expect((await runs.list({ status: ['running', 'completed'] })).data.map((r) => r.runId).sort()).toEqual([a, b].sort());
    } finally {
      await world.close();
    }
  });

  it('waits for a run to end, gives it as it is when the time runs out, and refuses a missing run', async () => {
    const world = createWorld({ dataDir: tempDir() });
    try {
      const runs = world.runs as unknown as Runs;
      const runId = await started(world);
      expect((await runs.waitForTerminalStatus(runId, { timeoutMs: 100 })).status).toBe('running');
      const t0 = Date.now();
      const waiting = runs.waitForTerminalStatus(runId, { timeoutMs: 30_000 });
      setTimeout(() => void world.events.create(runId, { eventType: 'run_completed', eventData: { output: new Uint8Array([2]) } } as never), 200);
      expect((await waiting).status).toBe('completed');
      expect(Date.now() - t0).toBeLessThan(10_000);
      await expect(runs.waitForTerminalStatus('wrun_missing')).rejects.toMatchObject({ name: 'WorkflowRunNotFoundError' });
    } finally {
      await world.close();
    }
  });

  it("lists a correlation id's events in the run named", async () => {
    const world = createWorld({ dataDir: tempDir() });
    try {
      const a = await started(world);
      const b = await started(world);
      for (const runId of [a, b]) await world.events.create(runId, { eventType: 'wait_created', correlationId: 'wait_1', eventData: { resumeAt: new Date() } } as never);
      const listed = await world.events.listByCorrelationId({ correlationId: 'wait_1', runId: b } as never);
      expect(listed.data.map((e) => e.runId)).toEqual([b]);
      expect((await world.events.listByCorrelationId({ correlationId: 'wait_1' })).data).toHaveLength(2);
    } finally {
      await world.close();
    }
  });
});

describe('hook resumes deduplicated by resume id', () => {
  it("collapses writes of one resume onto the first's event, keeps its resumeId, and refuses it for another hook or payload", async () => {
    const world = createWorld({ dataDir: tempDir() });
    try {
      expect(world.capabilities.hookResumeDedup).toBe(true);
      const created = await world.events.create(null, { eventType: 'run_created', eventData: { deploymentId: 'd', workflowName: 'wf', input: new Uint8Array([1]) } } as never);
      const runId = (created as { run: { runId: string } }).run.runId;
      await world.events.create(runId, { eventType: 'run_started' } as never);
      for (const [hook, token] of [['hook_a', 'tok_a'], ['hook_b', 'tok_b']]) {
        await world.events.create(runId, { eventType: 'hook_created', correlationId: hook, eventData: { token } } as never);
      }
      const resume = (hook: string, digest: string, payload: number) =>
        world.events.create(runId, { eventType: 'hook_received', correlationId: hook, eventData: { payload: new Uint8Array([payload]) } } as never, { resumeId: 'res_1', resumePayloadDigest: digest } as never) as Promise<{ event: { eventId: string; resumeId?: string } }>;
      const [first, second] = await Promise.all([resume('hook_a', 'd1', 1), resume('hook_a', 'd1', 1)]);
      expect(second.event.eventId).toBe(first.event.eventId);
      expect(first.event.resumeId).toBe('res_1');
      const listed = (await world.events.list({ runId })).data.filter((e) => e.eventType === 'hook_received');
      expect(listed).toHaveLength(1);
      expect((listed[0] as { resumeId?: string }).resumeId).toBe('res_1');
      expect(Object.keys(listed[0])).not.toContain('resumePayloadDigest');
      await expect(resume('hook_b', 'd1', 1)).rejects.toMatchObject({ name: 'EntityConflictError' });
      await expect(resume('hook_a', 'd2', 2)).rejects.toMatchObject({ name: 'EntityConflictError' });
      // Without a resume id, every write is a resume of its own.
      await world.events.create(runId, { eventType: 'hook_received', correlationId: 'hook_a', eventData: { payload: new Uint8Array([3]) } } as never);
      expect((await world.events.list({ runId })).data.filter((e) => e.eventType === 'hook_received')).toHaveLength(2);
    } finally {
      await world.close();
    }
  });
});

describe('the inline delta on a hook create', () => {
  it('answers sinceCursor with the events after it, the hook_created or the hook_conflict among them', async () => {
    const world = createWorld({ dataDir: tempDir() });
    try {
      type Listed = { events?: { eventType: string }[]; hasMore?: boolean };
      const runs: string[] = [];
      for (let i = 0; i < 2; i++) {
        const created = await world.events.create(null, { eventType: 'run_created', eventData: { deploymentId: 'd', workflowName: 'wf', input: new Uint8Array([1]) } } as never);
        runs.push((created as { run: { runId: string } }).run.runId);
        await world.events.create(runs[i], { eventType: 'run_started' } as never);
      }
      const cursorOf = async (runId: string) => (await world.events.list({ runId })).data[0].eventId;
      const first = (await world.events.create(runs[0], { eventType: 'hook_created', correlationId: 'hook_a', eventData: { token: 'tok' } } as never, { sinceCursor: await cursorOf(runs[0]) } as never)) as Listed;
      expect(first.events?.map((e) => e.eventType)).toEqual(['run_started', 'hook_created']);
      expect(first.hasMore).toBe(false);
      const second = (await world.events.create(runs[1], { eventType: 'hook_created', correlationId: 'hook_b', eventData: { token: 'tok' } } as never, { sinceCursor: await cursorOf(runs[1]) } as never)) as Listed;
      expect(second.events?.map((e) => e.eventType)).toEqual(['run_started', 'hook_conflict']);
      const plain = (await world.events.create(runs[0], { eventType: 'hook_created', correlationId: 'hook_c', eventData: { token: 'tok_c' } } as never)) as Listed;
      expect(plain.events).toBeUndefined();
    } finally {
      await world.close();
    }
  });
});

describe('an empty cursor', () => {
  it("starts a listing at its first page, as the SDK's CLI asks for one", async () => {
    const world = createWorld({ dataDir: tempDir() });
    try {
      const created = await world.events.create(null, { eventType: 'run_created', eventData: { deploymentId: 'd', workflowName: 'wf', input: new Uint8Array([1]) } } as never);
      const runId = (created as { run: { runId: string } }).run.runId;
      await world.events.create(runId, { eventType: 'run_started' } as never);
      await world.events.create(runId, { eventType: 'step_created', correlationId: 'step_1', eventData: { stepName: 's', input: new Uint8Array([2]) } } as never);
      for (const sortOrder of ['asc', 'desc'] as const) {
        const pagination = { cursor: '', sortOrder };
        expect((await world.runs.list({ pagination })).data.map((r) => r.runId)).toEqual([runId]);
        expect((await world.events.list({ runId, pagination })).data).toHaveLength(3);
        expect((await world.steps.list({ runId, pagination })).data.map((s) => s.stepId)).toEqual(['step_1']);
      }
    } finally {
      await world.close();
    }
  });
});

describe('a PostgreSQL world named by the environment alone', () => {
  it.skipIf(!needsPostgres())('opens WORKFLOW_LITTLE_DATABASE_URL in the schema WORKFLOW_LITTLE_SCHEMA, and closes it with the World', async () => {
    const schema = freshSchema();
    const prior = { url: process.env.WORKFLOW_LITTLE_DATABASE_URL, schema: process.env.WORKFLOW_LITTLE_SCHEMA };
    process.env.WORKFLOW_LITTLE_DATABASE_URL = postgresUrl();
    process.env.WORKFLOW_LITTLE_SCHEMA = schema;
    let runId: string;
    try {
      const world = createWorld();
      const created = await world.events.create(null, { eventType: 'run_created', eventData: { deploymentId: 'd', workflowName: 'wf', input: new Uint8Array([1]) } } as never);
      runId = (created as { run: { runId: string } }).run.runId;
      await world.close();
    } finally {
      for (const [key, value] of [['WORKFLOW_LITTLE_DATABASE_URL', prior.url], ['WORKFLOW_LITTLE_SCHEMA', prior.schema]] as const) {
        if (value === undefined) delete process.env[key];
        else process.env[key] = value;
      }
    }
    const store = postgresWorld({ connectionString: postgresUrl() as string, schema });
    try {
      expect((await listEvents(store, `run_${runId}`)).map((e) => e.type)).toEqual(['workflow.run_created']);
    } finally {
      await store.close();
    }
  });
});
