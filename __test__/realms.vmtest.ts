// The package under Vitest's `vmThreads` pool (vitest.vm.config.mts), where a test file runs in a
// `vm` context of its own while the native addon makes its objects in Node's main one: errors are
// the package's classes and this context's `Error`, and what comes back is of this realm.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import vm from 'node:vm';
import { afterAll, describe, expect, it } from 'vitest';
import {
  acquireRunLock,
  appendEvent,
  ArtifactNotFoundError,
  EventLogCorruptError,
  EventSequenceConflictError,
  EventValidationError,
  listEvents,
  localWorld,
  materializeRunState,
  readArtifact,
  RunLockedError,
  RuntimeIntegrityError,
  subscribe,
  validateEventLogShape,
  virtualWorld,
  WorldError,
  WorldPathError,
  writeArtifact,
} from '@little-workflow/world';
import { decode, encode } from '../lib/vercel/store.js';

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});
function tempDir(): string {
  const d = mkdtempSync(join(tmpdir(), 'little-vm-'));
  dirs.push(d);
  return d;
}

/** A value made in a context of its own. */
const foreign = <T>(code: string): T => vm.runInNewContext(code) as T;

async function rejection(p: Promise<unknown>): Promise<WorldError> {
  return p.then(
    () => {
      throw new Error('expected a rejection, got a value');
    },
    (err: WorldError) => err,
  );
}

function expectError(err: unknown, Class: abstract new (...args: never[]) => WorldError, code: string): void {
  expect(err).toBeInstanceOf(Class);
  expect(err).toBeInstanceOf(WorldError);
  expect(err).toBeInstanceOf(Error);
  expect((err as WorldError).code).toBe(code);
  expect(Object.getPrototypeOf((err as WorldError).details)).toBe(Object.prototype);
}

const step = (stepPath: string) => ({ type: 'StepStarted', payload: { stepPath } });

describe('under vmThreads', () => {
  it("runs in a context that is not Node's main one", () => {
    expect(vm.runInThisContext('Error')).not.toBe(Error);
  });

  it("rejects with the package's classes, of this context's Error", async () => {
    const world = virtualWorld();
    await expect(appendEvent(world, 'bad id', step('a'))).rejects.toBeInstanceOf(WorldPathError);
    expectError(await rejection(appendEvent(world, 'bad id', step('a'))), WorldPathError, 'WORLD_PATH');
    expectError(await rejection(appendEvent(world, 'run_a', { type: 'StepStarted', payload: {} })), EventValidationError, 'EVENT_VALIDATION');
    const e = await appendEvent(world, 'run_a', step('a'));
    expectError(await rejection(appendEvent(world, 'run_a', { ...step('b'), expectedSequence: 0 })), EventSequenceConflictError, 'EVENT_SEQUENCE_CONFLICT');
    expectError(await rejection(readArtifact(world, 'art_0123456789abcdef')), ArtifactNotFoundError, 'ARTIFACT_NOT_FOUND');
    const lock = await acquireRunLock(world, 'run_a');
    expectError(await rejection(acquireRunLock(world, 'run_a')), RunLockedError, 'RUN_LOCKED');
    await lock.release();
    let corrupt: unknown;
    try {
      validateEventLogShape([{ ...e, payload: { stepPath: 'changed' } }]);
    } catch (err) {
      corrupt = err;
    }
    expectError(corrupt, EventLogCorruptError, 'EVENT_LOG_CORRUPT');
    expect(corrupt).toBeInstanceOf(RuntimeIntegrityError);
    await world.close();
  });

  it('returns envelopes, states and bytes of this realm', async () => {
    const world = localWorld({ dataDir: tempDir() });
    await appendEvent(world, 'run_a', { type: 'RunStarted', payload: { input: { list: [1] } } });
    const listed = await listEvents(world, 'run_a');
    expect(Object.getPrototypeOf(listed)).toBe(Array.prototype);
    expect(Object.getPrototypeOf(listed[0])).toBe(Object.prototype);
    expect(listed[0].payload.input).toEqual({ list: [1] });
    expect(Object.getPrototypeOf((listed[0].payload.input as { list: unknown }).list)).toBe(Array.prototype);
    const state = await materializeRunState(world, 'run_a');
    expect(Object.getPrototypeOf(state)).toBe(Object.prototype);
    expect(state.status).toBe('running');
    const m = await writeArtifact(world, { runId: 'run_a', stepPath: 's', name: 'b', contentType: 'application/octet-stream', encoding: 'bytes', payload: foreign<Uint8Array>('new Uint8Array([7, 8])') });
    const { payload } = await readArtifact(world, m.artifactRef);
    expect(payload).toBeInstanceOf(Uint8Array);
    expect(Buffer.isBuffer(payload)).toBe(true);
    expect([...(payload as Uint8Array)]).toEqual([7, 8]);
    const sub = subscribe(world, 'run_a');
    expect(Object.getPrototypeOf((await sub.next()).value)).toBe(Object.prototype);
    await sub.return();
    await world.close();
  });

  it("encodes another context's bytes and dates for the Vercel World as bytes and dates", async () => {
    // The Vercel World itself loads the Workflow SDK through a dynamic import, which this pool's
    // CommonJS loader cannot make: its encoding is checked on its own.
    const home = { world: virtualWorld(), runId: 'run_v', name: 'v' };
    const encoded = await encode({ bytes: foreign<Uint8Array>('new Uint8Array([1, 2, 3])'), at: foreign<Date>('new Date(86400000)') }, home);
    expect(encoded).toEqual({ bytes: { $bytes: 'AQID' }, at: { $date: '1970-01-02T00:00:00.000Z' } });
    const decoded = (await decode(encoded, home.world)) as { bytes: Uint8Array; at: Date };
    expect(decoded.bytes).toBeInstanceOf(Uint8Array);
    expect([...decoded.bytes]).toEqual([1, 2, 3]);
    expect(decoded.at).toBeInstanceOf(Date);
    await home.world.close();
  });
});
