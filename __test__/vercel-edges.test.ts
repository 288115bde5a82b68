// The Vercel World's answers at the edges of what the SDK may send: texts longer than an index
// entry holds, values that look like the encoding's own markers or have a `__proto__` key,
// entities changed by their caller, and waits of a run that has ended.
import { describe, expect, it } from 'vitest';
import { createWorld as createLocalWorld } from '@workflow/world-local';
import { createWorld } from '@little-workflow/world/vercel';
import { sameValue, tempDir } from './helpers';

const bytes = (...b: number[]) => new Uint8Array(b);

async function newRun(world: ReturnType<typeof createWorld>, workflowName = 'wf') {
  const created = await world.events.create(null, { eventType: 'run_created', eventData: { deploymentId: 'd', workflowName, input: bytes(1) } } as never);
  const runId = (created as { run: { runId: string } }).run.runId;
  await world.events.create(runId, { eventType: 'run_started' } as never);
  return runId;
}

describe('the Vercel World at the edges', () => {
  it('finds hooks, correlation ids and workflow names of any length, and keeps a long token to one run', async () => {
    const world = createWorld({ dataDir: tempDir() });
    try {
      const token = 'é'.repeat(600); // 1,200 bytes of UTF-8
      const name = `workflow//${'n'.repeat(2000)}`;
      const a = await newRun(world, name);
      const b = await newRun(world);
      await world.events.create(a, { eventType: 'hook_created', correlationId: 'hook_a', eventData: { token } } as never);
      expect((await world.hooks.getByToken(token)).runId).toBe(a);
      expect((await world.hooks.list({})).data.map((h) => h.hookId)).toEqual(['hook_a']);
      const other = await world.events.create(b, { eventType: 'hook_created', correlationId: 'hook_b', eventData: { token } } as never);
      expect((other as { event: { eventType: string } }).event.eventType).toBe('hook_conflict');
      const cid = `wait_${'ü'.repeat(950)}`;
      await world.events.create(a, { eventType: 'wait_created', correlationId: cid, eventData: { resumeAt: new Date() } } as never);
      const byCid = await world.events.listByCorrelationId({ correlationId: cid });
      expect(byCid.data.map((e) => e.eventType)).toEqual(['wait_created']);
      expect((await world.runs.list({ workflowName: name })).data.map((r) => r.runId)).toEqual([a]);
      expect((await world.hooks.get('hook_a')).token).toBe(token);
    } finally {
      await world.close();
    }
  });

  it('reads back a value shaped like the encoding of an artifact, bytes or a date', async () => {
    const world = createWorld({ dataDir: tempDir() });
    try {
      const runId = await newRun(world);
      const result = { ref: { $artifact: 'x' }, nested: [{ $bytes: 'AAAA' }, { $date: 'soon' }, { $esc: { a: 1 } }] };
      await world.events.create(runId, { eventType: 'step_created', correlationId: 'step_1', eventData: { stepName: 's', input: bytes(2) } } as never);
      await world.events.create(runId, { eventType: 'step_started', correlationId: 'step_1' } as never);
      await world.events.create(runId, { eventType: 'step_completed', correlationId: 'step_1', eventData: { result } } as never);
      expect((await world.steps.get(runId, 'step_1')).output).toEqual(result);
    } finally {
      await world.close();
    }
  });

  it("keeps own __proto__ keys of a run's input, a step's result, a hook's payload and a queue's body, as world-local does", async () => {
    // As JSON.parse makes them: `__proto__` an own key, beside keys that name Object's methods.
    const value = () => JSON.parse('{"__proto__":{"$bytes":"AA=="},"name":"n","list":[{"__proto__":[1,2]}],"constructor":{"toString":"s"}}') as unknown;
    type Sdk = Pick<ReturnType<typeof createWorld>, 'events' | 'runs' | 'steps' | 'hooks' | 'queue' | 'createQueueHandler' | 'registerHandler'>;
    /** What a world gives back of each value it was given. */
    async function roundTrip(world: Sdk): Promise<Record<string, unknown>> {
      const created = (await world.events.create(null, { eventType: 'run_created', eventData: { deploymentId: 'd', workflowName: 'wf', input: value() } } as never)) as { run: { runId: string } };
      const runId = created.run.runId;
      await world.events.create(runId, { eventType: 'run_started' } as never);
      await world.events.create(runId, { eventType: 'step_created', correlationId: 'step_1', eventData: { stepName: 's', input: value() } } as never);
      await world.events.create(runId, { eventType: 'step_started', correlationId: 'step_1' } as never);
      await world.events.create(runId, { eventType: 'step_completed', correlationId: 'step_1', eventData: { result: value() } } as never);
      await world.events.create(runId, { eventType: 'hook_created', correlationId: 'hook_1', eventData: { token: `tok-${runId}`, metadata: value() } } as never);
      await world.events.create(runId, { eventType: 'hook_received', correlationId: 'hook_1', eventData: { payload: value() } } as never);
      let received!: (message: unknown) => void;
      const message = new Promise<unknown>((resolve) => (received = resolve));
      world.registerHandler(
        '__wkf_workflow_',
        world.createQueueHandler('__wkf_workflow_', async (m) => {
          received(m);
        }),
      );
      await world.queue('__wkf_workflow_proto' as never, value() as never);
      const events = (await world.events.list({ runId, pagination: { limit: 100 } } as never)).data as { eventType: string; eventData?: Record<string, unknown> }[];
      return {
        runInput: (await world.runs.get(runId)).input,
        stepInput: (await world.steps.get(runId, 'step_1')).input,
        stepOutput: (await world.steps.get(runId, 'step_1')).output,
        hookMetadata: (await world.hooks.get('hook_1')).metadata,
        hookPayload: events.find((e) => e.eventType === 'hook_received')?.eventData?.payload,
        queueBody: await message,
      };
    }
    const ours = createWorld({ dataDir: tempDir() });
    const local = createLocalWorld({ dataDir: tempDir() });
    try {
      const mine = await roundTrip(ours);
      const theirs = await roundTrip(local as unknown as Sdk);
      for (const [what, v] of Object.entries(mine)) {
        expect(sameValue(v, value()), `${what}: ${JSON.stringify(v)}`).toBe(true);
        expect(sameValue(v, theirs[what]), `${what} as world-local gives it: ${JSON.stringify(theirs[what])}`).toBe(true);
      }
    } finally {
      await ours.close();
      await (local as { close?: () => Promise<void> }).close?.();
    }
  });

  it('hands out copies, so a caller that changes a run changes nothing stored', async () => {
    const world = createWorld({ dataDir: tempDir() });
    try {
      const runId = await newRun(world);
      const again = (await world.events.create(runId, { eventType: 'run_started' } as never)) as { run: { status: string; input: Uint8Array } };
      again.run.status = 'completed';
      again.run.input[0] = 99;
      const run = await world.runs.get(runId);
      expect(run.status).toBe('running');
      expect(run.input).toEqual(bytes(1));
    } finally {
      await world.close();
    }
  });

  it('refuses to complete a wait of a run that has ended', async () => {
    const world = createWorld({ dataDir: tempDir() });
    try {
      const runId = await newRun(world);
      await world.events.create(runId, { eventType: 'wait_created', correlationId: 'wait_1', eventData: { resumeAt: new Date() } } as never);
      await world.events.create(runId, { eventType: 'run_completed', eventData: { output: bytes(3) } } as never);
      await expect(world.events.create(runId, { eventType: 'wait_completed', correlationId: 'wait_1' } as never)).rejects.toMatchObject({ status: 404 });
      expect((await world.events.list({ runId })).data.map((e) => e.eventType)).not.toContain('wait_completed');
    } finally {
      await world.close();
    }
  });

  it('lets a delivery under way finish and record its outcome before close() resolves', async () => {
    const dataDir = tempDir();
    const world = createWorld({ dataDir });
    let calls = 0;
    let started!: () => void;
    const handling = new Promise<void>((resolve) => (started = resolve));
    world.registerHandler('__wkf_workflow_', async () => {
      calls++;
      started();
      await new Promise((r) => setTimeout(r, 300));
      return new Response('ok');
    });
    await world.queue('__wkf_workflow_edge' as never, { runId: 'wrun_x' } as never);
    await handling;
    await world.close();
    // Another process's World finds nothing left to deliver.
    const next = createWorld({ dataDir });
    next.registerHandler('__wkf_workflow_', async () => {
      calls++;
      return new Response('ok');
    });
    await next.start();
    await new Promise((r) => setTimeout(r, 200));
    await next.close();
    expect(calls).toBe(1);
  });

  it("applies the SDK's own attribute rules, writing nothing that breaks them", async () => {
    const world = createWorld({ dataDir: tempDir() });
    try {
      const refused = world.events.create(null, { eventType: 'run_created', eventData: { deploymentId: 'd', workflowName: 'wf', input: bytes(1), attributes: { $reserved: 'x' } } } as never);
      await expect(refused).rejects.toMatchObject({ name: 'AttributeValidationError' });
      const runId = await newRun(world);
      const set = world.events.create(runId, { eventType: 'attr_set', eventData: { changes: [{ key: '$artifact', value: 'x' }], writer: { type: 'step' } } } as never);
      await expect(set).rejects.toMatchObject({ name: 'AttributeValidationError' });
      expect((await world.events.list({ runId })).data.map((e) => e.eventType)).toEqual(['run_created', 'run_started']);
      await world.events.create(runId, { eventType: 'attr_set', eventData: { changes: [{ key: 'team', value: 'blue' }], writer: { type: 'step' } } } as never);
      expect((await world.runs.get(runId)).attributes).toEqual({ team: 'blue' });
      // A key the rules allow is kept, `__proto__` too (world-local's merge assigns it, and loses it).
      await world.events.create(runId, { eventType: 'attr_set', eventData: { changes: [{ key: '__proto__', value: 'x' }], writer: { type: 'step' } } } as never);
      expect(sameValue((await world.runs.get(runId)).attributes, JSON.parse('{"team":"blue","__proto__":"x"}'))).toBe(true);
    } finally {
      await world.close();
    }
  });
});
