// Inputs a caller can get wrong in JavaScript's own ways, and what each one gets back: a typed
// error that says what was wrong, and nothing stored.
import { readdirSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import {
  acquireOuterLoopLock,
  acquireRunLock,
  appendEvent,
  EventValidationError,
  listEvents,
  localWorld,
  materializeRunState,
  postgresWorld,
  readArtifact,
  readOuterLoopManifest,
  verifyWorld,
  WorldClosedError,
  WorldError,
  WorldPathError,
  writeArtifact,
  writeOuterLoopManifest,
} from '@little-workflow/world';
import { rejection, tempDir, track, worldKinds } from './helpers';

function thrown(f: () => unknown): Error {
  try {
    f();
  } catch (e) {
    return e as Error;
  }
  throw new Error('expected a throw');
}

describe.each(worldKinds)('inputs on %s', (_name, makeWorld) => {
  it('a closed world says it is closed before it looks at the arguments', async () => {
    const world = makeWorld();
    await world.close();
    const calls: Array<[string, () => Promise<unknown>]> = [
      ['appendEvent', () => appendEvent(world, 'not a run' as never, { type: 'x', payload: {} })],
      ['listEvents', () => listEvents(world, 7 as never)],
      ['materializeRunState', () => materializeRunState(world, 'bad')],
      ['writeArtifact', () => writeArtifact(world, { runId: 'run_a' } as never)],
      ['readArtifact', () => readArtifact(world, 'nope')],
      ['acquireRunLock', () => acquireRunLock(world, 'bad')],
      ['acquireOuterLoopLock', () => acquireOuterLoopLock(world, '../x')],
      ['readOuterLoopManifest', () => readOuterLoopManifest(world, '../x')],
      ['writeOuterLoopManifest', () => writeOuterLoopManifest(world, 5 as never)],
      ['verifyWorld', () => verifyWorld(world, 'bad')],
    ];
    for (const [name, call] of calls) {
      expect(await rejection(call()), name).toBeInstanceOf(WorldClosedError);
    }
  });

  it('refuses a bytes payload whose ArrayBuffer was transferred away, instead of storing it empty', async () => {
    const world = makeWorld();
    const input = { runId: 'run_a', stepPath: 's', name: 'n', contentType: 'application/octet-stream', encoding: 'bytes' as const };
    for (const make of [() => new Uint8Array(8), () => Buffer.from(new ArrayBuffer(8))]) {
      const payload = make();
      structuredClone(payload.buffer, { transfer: [payload.buffer] });
      const err = await rejection(writeArtifact(world, { ...input, payload }));
      expect(err).toBeInstanceOf(EventValidationError);
      expect(err.code).toBe('EVENT_VALIDATION');
      expect(err.path).toBe('input.payload');
      expect(err.runId).toBe('run_a');
    }
    // An empty payload that was never transferred is an empty artifact.
    const m = await writeArtifact(world, { ...input, payload: new Uint8Array(0) });
    expect(m.sizeBytes).toBe(0);
  });

  it('clears pendingCycleRunId written as undefined, as it does for null, and keeps it when left out', async () => {
    const world = makeWorld();
    const base = { outerLoopId: 'ol_u', inputHash: 'sha256:a', maxCycles: 3, cycles: [] };
    await writeOuterLoopManifest(world, { ...base, pendingCycleRunId: 'run_c1' });
    await writeOuterLoopManifest(world, base);
    const stored = await readOuterLoopManifest(world, 'ol_u');
    expect(stored?.pendingCycleRunId).toBe('run_c1');
    await writeOuterLoopManifest(world, { ...stored!, pendingCycleRunId: undefined, result: { kind: 'done' } });
    const done = await readOuterLoopManifest(world, 'ol_u');
    expect(done?.pendingCycleRunId).toBeUndefined();
    expect(done?.result).toEqual({ kind: 'done' });
  });

  it("names an append's own fault before its payload's for the event log's types, and a run event's payload first, as a draft's", async () => {
    const world = makeWorld();
    const badIndex = [{ index: '', key: 'k', value: 'v' }];
    const logged = await rejection(appendEvent(world, 'run_o', { type: 'harness.model.responded', payload: {} }));
    expect(logged.path).toBe('appendIdempotencyKey');
    const step = await rejection(appendEvent(world, 'run_o', { type: 'StepStarted', payload: {}, index: badIndex }));
    expect(step.path).toBe('index[0].index');
    const run = await rejection(appendEvent(world, 'run_o', { type: 'node:started', payload: {}, index: badIndex }));
    expect(run.path).toMatch(/^payload\./);
  });
});

describe('localWorld options', () => {
  it('refuses a dataDir with a lone surrogate, which two different strings would share as a path', () => {
    const base = tempDir();
    const err = thrown(() => localWorld({ dataDir: `${base}/w-\ud800` })) as WorldError;
    expect(err).toBeInstanceOf(WorldPathError);
    expect(err.code).toBe('WORLD_PATH');
    expect(err.path).toBe('dataDir');
    // Nothing was made at the path the string would have become.
    expect(readdirSync(base)).toEqual([]);
  });

  it('refuses a durability that is not a string with a WorldError', () => {
    const err = thrown(() => track(localWorld({ dataDir: tempDir(), durability: 5 as never }))) as WorldError;
    expect(err).toBeInstanceOf(WorldError);
    expect(err).toBeInstanceOf(EventValidationError);
    expect(err.code).toBe('EVENT_VALIDATION');
    expect(err.path).toBe('durability');
  });
});

describe('postgresWorld options', () => {
  it('refuses a malformed connection string as it refuses any bad option, and never shows its password', () => {
    const bad = (options: Record<string, unknown>) => thrown(() => track(postgresWorld(options as never))) as WorldError;
    const option = bad({ connectionString: 'postgres://h/db', lockLeaseMs: -1 });
    for (const connectionString of ['mysql://alice:s3cr3t-pw@h/db', 'postgres://alice:s3cr3t-pw@h:port/db', "host=h password='s3cr3t-pw"]) {
      const err = bad({ connectionString });
      expect(err).toBeInstanceOf(EventValidationError);
      expect(err.code).toBe(option.code);
      expect(err.path).toBe('connectionString');
      expect(err.message).not.toContain('s3cr3t');
    }
  });
});
