// Deleting or pruning a Workflow SDK run through this package (`deleteRun`, `pruneRuns` on the
// run's log) takes its stream logs and queue-message logs along, on each kind of world that keeps
// them: what other runs wrote, and a message for no run, stay. The 4.x line's streams, known by
// their name alone, go with their run too.
import './vercel-setup.js';
import { describe, expect, it } from 'vitest';
import { createWorld } from '@little-workflow/world/vercel';
import { deleteRun, listEvents, listIndexEntries, localWorld, pruneRuns, queryRuns, verifyWorld, type World } from '@little-workflow/world';
import { createWorldLevelStreams } from '../lib/vercel/streams.js';
import { tempDir, track, worldKinds } from './helpers';

type Sdk = ReturnType<typeof createWorld>;

/** Answer every message of the app's queues in this process, as a handler that finds nothing to do. */
function handleAll(sdk: Sdk): void {
  for (const prefix of ['__wkf_workflow_', '__wkf_step_']) {
    sdk.registerHandler(prefix, sdk.createQueueHandler(prefix as never, async () => undefined));
  }
}

const bytes = (...b: number[]) => new Uint8Array(b);

/** A run with a completed step, a hook, a closed stream and a message of each queue; its log and the logs it wrote to. */
async function busyRun(world: World, sdk: Sdk, tag: string) {
  const created = await sdk.events.create(null, { eventType: 'run_created', eventData: { deploymentId: 'd', workflowName: 'wf', input: bytes(1) } } as never);
  const runId = (created as { run: { runId: string } }).run.runId;
  await sdk.events.create(runId, { eventType: 'run_started' } as never);
  await sdk.events.create(runId, { eventType: 'step_created', correlationId: 'step_1', eventData: { stepName: 's', input: bytes(2) } } as never);
  await sdk.events.create(runId, { eventType: 'step_started', correlationId: 'step_1' } as never);
  await sdk.events.create(runId, { eventType: 'step_completed', correlationId: 'step_1', eventData: { result: bytes(3) } } as never);
  await sdk.events.create(runId, { eventType: 'hook_created', correlationId: 'hook_1', eventData: { token: `tok-${tag}` } } as never);
  const s = sdk as unknown as Record<string, (...args: unknown[]) => Promise<void>> & { streams?: Sdk['streams'] };
  if (s.streams !== undefined) {
    await s.streams.write(runId, 'out', `chunk of ${tag}`);
    await s.streams.close(runId, 'out');
  } else {
    await s.writeToStream(`strm_${tag}`, runId, `chunk of ${tag}`);
    await s.closeStream(`strm_${tag}`, runId);
  }
  // Not due for an hour: nothing delivers them while the test runs.
  const later = { delaySeconds: 3600 };
  const flow = await sdk.queue('__wkf_workflow_wf' as never, { runId } as never, later);
  const step = await sdk.queue('__wkf_step_s' as never, { workflowName: 'wf', workflowRunId: runId, workflowStartedAt: Date.now(), stepId: 'step_1' } as never, later);
  const streams = (await listIndexEntries(world, 'workflow.stream', { value: runId })).map((e) => e.runId);
  const queued = [flow, step].map((m) => `run_wq_${m.messageId}`);
  expect(streams).toHaveLength(1);
  for (const log of [...streams, ...queued]) expect((await listEvents(world, log)).length).toBeGreaterThan(0);
  return { runId, log: `run_${runId}`, logs: [...streams, ...queued] };
}

async function logIds(world: World): Promise<string[]> {
  return (await queryRuns(world, { order: 'id', limit: 1000 })).runs.map((r) => r.runId);
}

async function sdkRuns(sdk: Sdk): Promise<string[]> {
  return (await sdk.runs.list({} as never)).data.map((r) => r.runId);
}

/** That the run and every log it wrote to are gone, and its hook with them. */
async function expectGone(world: World, sdk: Sdk, run: Awaited<ReturnType<typeof busyRun>>): Promise<void> {
  const listed = await logIds(world);
  for (const log of [run.log, ...run.logs]) {
    expect(listed).not.toContain(log);
    expect(await listEvents(world, log)).toEqual([]);
  }
  expect(await sdkRuns(sdk)).not.toContain(run.runId);
  expect((await sdk.hooks.list({} as never)).data.map((h) => h.runId)).not.toContain(run.runId);
  expect(await listIndexEntries(world, 'workflow.stream', { value: run.runId })).toEqual([]);
}

/** That the run and every log it wrote to are still there. */
async function expectKept(world: World, sdk: Sdk, run: Awaited<ReturnType<typeof busyRun>>): Promise<void> {
  const listed = await logIds(world);
  for (const log of [run.log, ...run.logs]) expect(listed).toContain(log);
  expect(await sdkRuns(sdk)).toContain(run.runId);
}

describe.each(worldKinds.filter(([kind]) => kind === 'localWorld' || kind === 'postgresWorld'))('an SDK run deleted on %s', (_kind, open) => {
  it('goes with its streams, queue messages and hook, through deleteRun and through pruneRuns', async () => {
    const world = open();
    const sdk = createWorld({ world });
    try {
      const doomed = await busyRun(world, sdk, 'doomed');
      const other = await busyRun(world, sdk, 'other');
      const forNoRun = await sdk.queue('__wkf_workflow_wf' as never, { __healthCheck: true, correlationId: 'probe' } as never, { delaySeconds: 3600 });

      expect((await deleteRun(world, doomed.log)).deleted).toBe(true);
      await expectGone(world, sdk, doomed);
      await expectKept(world, sdk, other);
      expect(await logIds(world)).toContain(`run_wq_${forNoRun.messageId}`);
      expect((await verifyWorld(world)).ok).toBe(true);

      // Pruned once it completed: the run it ended before is pruned, the one still running is not.
      const done = await busyRun(world, sdk, 'done');
      await sdk.events.create(done.runId, { eventType: 'run_completed', eventData: { output: bytes(4) } } as never);
      expect(await pruneRuns(world, { endedBefore: new Date(Date.now() + 60_000) })).toMatchObject({ runs: 1 });
      await expectGone(world, sdk, done);
      await expectKept(world, sdk, other);
      expect(await logIds(world)).toContain(`run_wq_${forNoRun.messageId}`);
      expect((await verifyWorld(world)).ok).toBe(true);
    } finally {
      await sdk.close();
    }
  });
});

describe.each(worldKinds.filter(([kind]) => kind === 'localWorld' || kind === 'postgresWorld'))('writes for an SDK run deleted on %s', (_kind, open) => {
  it('are refused and leave no log: a stream written on, a new stream, a message enqueued', async () => {
    const world = open();
    const sdk = createWorld({ world });
    try {
      const doomed = await busyRun(world, sdk, 'doomed');
      const s = sdk.streams;
      await deleteRun(world, doomed.log);
      handleAll(sdk);
      const before = await logIds(world);
      // A step still running: it writes on to its stream, opens another and enqueues a message.
      await expect(s.write(doomed.runId, 'out', 'late')).rejects.toMatchObject({ name: 'WorkflowWorldError', status: 410 });
      await expect(s.write(doomed.runId, 'other', 'late')).rejects.toMatchObject({ name: 'WorkflowWorldError', status: 410 });
      await expect(s.close(doomed.runId, 'out')).rejects.toMatchObject({ status: 410 });
      const late = await sdk.queue('__wkf_step_s' as never, { workflowName: 'wf', workflowRunId: doomed.runId, workflowStartedAt: Date.now(), stepId: 'step_2' } as never);
      // Delivered (the step handler finds no run) and then deleted: nothing of the run is left.
      const lateLog = `run_wq_${late.messageId}`;
      const end = Date.now() + 20_000;
      while ((await listEvents(world, lateLog)).length > 0 && Date.now() < end) await new Promise((r) => setTimeout(r, 100));
      expect(await listEvents(world, lateLog)).toEqual([]);
      // A PostgreSQL world's process looks again at what it enqueued, and enqueues again what the
      // store lost: the run's messages, deleted with it, are not among them.
      if (world.kind === 'postgres') await new Promise((r) => setTimeout(r, 5_500));
      expect(await logIds(world)).toEqual(before);
      expect((await verifyWorld(world)).ok).toBe(true);
    } finally {
      await sdk.close();
    }
  });

  it("names a run created after its first message that run's owner once delivered, so the message goes with it", async () => {
    const world = open();
    const sdk = createWorld({ world });
    try {
      // As the SDK starts a run: its first message may be enqueued before run_created commits.
      handleAll(sdk);
      const runId = 'wrun_01ADOPTED0000000000000000';
      const first = await sdk.queue('__wkf_workflow_wf' as never, { runId } as never, { delaySeconds: 1 });
      await sdk.events.create(runId, { eventType: 'run_created', eventData: { deploymentId: 'd', workflowName: 'wf', input: bytes(1) } } as never);
      const log = `run_wq_${first.messageId}`;
      const end = Date.now() + 20_000;
      const delivered = async () => (await listEvents(world, log)).some((e) => e.type === 'workflow.queue.delivered' || e.type === 'workflow.queue.attempt_failed');
      while (!(await delivered()) && Date.now() < end) await new Promise((r) => setTimeout(r, 100));
      expect(await delivered()).toBe(true);
      await deleteRun(world, `run_${runId}`);
      expect(await listEvents(world, log)).toEqual([]);
    } finally {
      await sdk.close();
    }
  });
});

describe("the 4.x line's streams", () => {
  it('go with the run they were written for', async () => {
    const world = track(localWorld({ dataDir: tempDir() }));
    const sdk = createWorld({ world });
    try {
      const streams = createWorldLevelStreams(world);
      const runs: string[] = [];
      for (const tag of ['doomed', 'other']) {
        const created = await sdk.events.create(null, { eventType: 'run_created', eventData: { deploymentId: 'd', workflowName: 'wf', input: bytes(1) } } as never);
        const runId = (created as { run: { runId: string } }).run.runId;
        await streams.writeToStream(`strm_${tag}`, runId, `chunk of ${tag}`);
        await streams.closeStream(`strm_${tag}`, runId);
        runs.push(runId);
      }
      const logOf = async (runId: string) => (await listIndexEntries(world, 'workflow.stream', { value: runId })).map((e) => e.runId);
      const [doomed] = await logOf(runs[0]);
      const [kept] = await logOf(runs[1]);
      expect(await logIds(world)).toEqual(expect.arrayContaining([doomed, kept]));
      await deleteRun(world, `run_${runs[0]}`);
      expect(await listEvents(world, doomed)).toEqual([]);
      expect(await logIds(world)).not.toContain(doomed);
      expect(await text(await streams.readFromStream('strm_other'))).toEqual(['chunk of other']);
      expect((await verifyWorld(world)).ok).toBe(true);
    } finally {
      await sdk.close();
    }
  });
});

async function text(stream: ReadableStream<Uint8Array>): Promise<string[]> {
  const out: string[] = [];
  for await (const chunk of stream as unknown as AsyncIterable<Uint8Array>) out.push(Buffer.from(chunk).toString('utf8'));
  return out;
}
