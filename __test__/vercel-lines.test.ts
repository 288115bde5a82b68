// What decides the interface the Vercel World serves: the line of the app's `@workflow/world`
// (spec versions from its own constants), and what the 4.x line calls that later lines do not:
// World-level stream methods with `(name, runId)` arguments, and a step found by its id alone.
import * as sdk from '@workflow/world';
import { describe, expect, it } from 'vitest';
import { createWorld } from '@little-workflow/world/vercel';
import { localWorld } from '@little-workflow/world';
import { lineOf } from '../lib/vercel/line.js';
import { createWorldLevelStreams } from '../lib/vercel/streams.js';
import { tempDir } from './helpers';

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

describe("the 4.x line's World-level streams", () => {
  it('writes, closes and reads a stream by its name, lists it by run, and pages and counts its chunks', async () => {
    const world = localWorld({ dataDir: tempDir() });
    try {
      const s = createWorldLevelStreams(world);
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
