// Values built to misbehave while they are read: getters that throw or answer differently each
// time, revoked Proxies, toJSON that returns nothing. Each call gets an EventValidationError naming
// where, with what was thrown as its cause, and what is stored is what was validated.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { describe, expect, it } from 'vitest';
import {
  appendEvent,
  appendRunEvent,
  canonicalize,
  EventLogCorruptError,
  EventValidationError,
  foldRunEvents,
  listEvents,
  localWorld,
  materializeRunStateFromEvents,
  restoreRunCosts,
  subscribe,
  validateEventLogShape,
  virtualWorld,
  writeArtifact,
  writeOuterLoopManifest,
  WorldError,
} from '@little-workflow/world';
import { packageRoot, rejection, tempDir, track, worldKinds } from './helpers';

class Boom extends Error {}

const revoked = (target: object = {}) => {
  const { proxy, revoke } = Proxy.revocable(target, {});
  revoke();
  return proxy;
};
const throwing = (key: string) =>
  Object.defineProperty({}, key, {
    enumerable: true,
    get() {
      throw new Boom('from a getter');
    },
  });

/** The error `f` throws or rejects with. */
async function failure(f: () => unknown): Promise<unknown> {
  try {
    await f();
  } catch (e) {
    return e;
  }
  throw new Error('expected a failure');
}

function expectValidation(err: unknown, path: string): void {
  expect(err).toBeInstanceOf(EventValidationError);
  expect((err as WorldError).code).toBe('EVENT_VALIDATION');
  expect((err as WorldError).path).toBe(path);
}

describe.each(worldKinds)('hostile values on %s', (_name, makeWorld) => {
  it('are refused with an EventValidationError naming the path, the original as its cause', async () => {
    const world = makeWorld();
    // [what, call, path, the cause: the caller's own error, the TypeError a revoked Proxy throws, or none]
    const cases: Array<[string, () => unknown, string, 'own' | 'type' | 'none']> = [
      ['toJSON() returning undefined as the payload', () => appendEvent(world, 'run_h', { type: 'T', payload: { toJSON: () => undefined } }), 'payload', 'none'],
      ['toJSON() returning undefined inside an array', () => appendEvent(world, 'run_h', { type: 'T', payload: { a: [{ toJSON: () => undefined }] } }), 'payload.a[0]', 'none'],
      ['a revoked Proxy as the payload', () => appendEvent(world, 'run_h', { type: 'T', payload: revoked() }), 'payload', 'type'],
      ['a revoked Proxy inside the payload', () => appendEvent(world, 'run_h', { type: 'T', payload: { a: { b: revoked() } } }), 'payload.a.b', 'type'],
      ['a revoked Proxy as the input', () => appendEvent(world, 'run_h', revoked() as never), 'input', 'type'],
      ['a getter on the input that throws', () => appendEvent(world, 'run_h', throwing('type') as never), 'type', 'own'],
      ['a getter on the payload that throws', () => appendEvent(world, 'run_h', { type: 'T', payload: { ok: 1, ...{}, nested: throwing('deep') } }), 'payload.nested.deep', 'own'],
      ['a throwing toJSON', () => appendEvent(world, 'run_h', { type: 'T', payload: { d: { toJSON() { throw new Boom('toJSON'); } } } }), 'payload.d', 'own'],
      ['a Proxy whose ownKeys trap throws', () => appendEvent(world, 'run_h', { type: 'T', payload: new Proxy({}, { ownKeys() { throw new Boom('keys'); } }) }), 'payload', 'own'],
      ['a getter on an artifact input', () => writeArtifact(world, Object.assign(throwing('stepPath'), { runId: 'run_h' }) as never), 'input.stepPath', 'own'],
      ['a revoked Proxy as an artifact input', () => writeArtifact(world, revoked() as never), 'input', 'type'],
      ['a revoked Proxy as a json artifact payload', () => writeArtifact(world, { runId: 'run_h', stepPath: 's', name: 'n', contentType: 'application/json', encoding: 'json', payload: revoked() }), 'input.payload', 'type'],
      ['a Proxy of a Uint8Array as bytes', () => writeArtifact(world, { runId: 'run_h', stepPath: 's', name: 'n', contentType: 'x/y', encoding: 'bytes', payload: new Proxy(new Uint8Array(4), {}) }), 'input.payload', 'none'],
      ['a revoked Proxy as a run event', () => appendRunEvent(world, 'run_h', revoked() as never), 'event', 'type'],
      ['a getter on a run event', () => appendRunEvent(world, 'run_h', throwing('type') as never), 'event.type', 'own'],
      ['a revoked Proxy as listEvents options', () => listEvents(world, 'run_h', revoked() as never), 'listEvents options', 'type'],
      ['a getter on listEvents options', () => listEvents(world, 'run_h', throwing('limit') as never), 'limit', 'own'],
      ['a revoked Proxy as a manifest', () => writeOuterLoopManifest(world, revoked() as never), 'manifest', 'type'],
      ['a revoked Proxy as subscribe options', () => subscribe(world, 'run_h', revoked() as never).next(), 'subscribe options', 'type'],
      ['a revoked Proxy as a signal', () => subscribe(world, 'run_h', { signal: revoked() as never }).next(), 'signal', 'none'],
      ['a revoked Proxy to canonicalize', () => canonicalize(revoked()), 'value', 'type'],
      ['a revoked Proxy as events to fold', () => materializeRunStateFromEvents('run_h', revoked([]) as never), 'events', 'type'],
      ['a revoked Proxy as run events', () => foldRunEvents(revoked([]) as never), 'events', 'type'],
      ['a getter in run events', () => restoreRunCosts([throwing('type')] as never), 'events[0].type', 'own'],
      ['a revoked Proxy as world options', () => virtualWorld(revoked() as never), 'virtualWorld options', 'type'],
      ['a getter on world options', () => localWorld(throwing('dataDir') as never), 'dataDir', 'own'],
    ];
    for (const [what, call, path, cause] of cases) {
      const err = await failure(call);
      expect(err, what).toBeInstanceOf(EventValidationError);
      expect((err as WorldError).path, what).toBe(path);
      if (cause === 'own') expect((err as Error).cause, what).toBeInstanceOf(Boom);
      if (cause === 'type') expect((err as Error).cause, what).toBeInstanceOf(TypeError);
    }
    // Nothing of it was stored.
    expect(await listEvents(world, 'run_h')).toEqual([]);
  });

  it('store what was validated: each field is read once', async () => {
    const world = makeWorld();
    let reads = 0;
    const flaky = Object.defineProperty({}, 'n', {
      enumerable: true,
      get: () => (++reads === 1 ? 1 : NaN),
    });
    const stored = await appendEvent(world, 'run_once', { type: 'T', payload: { flaky } });
    expect(stored.payload).toEqual({ flaky: { n: 1 } });
    expect(reads).toBe(1);
    expect((await listEvents(world, 'run_once'))[0]!.payload).toEqual({ flaky: { n: 1 } });

    // A toJSON that answers differently each time it is asked is asked once.
    let calls = 0;
    const changing = { toJSON: () => (++calls === 1 ? { v: 'first' } : NaN) };
    expect((await appendEvent(world, 'run_once', { type: 'T', payload: { changing } })).payload).toEqual({ changing: { v: 'first' } });
    expect(calls).toBe(1);

    // An input whose type changes on its second read is stored with the type it had.
    let typeReads = 0;
    const input = Object.defineProperty({ payload: {} }, 'type', { enumerable: true, get: () => (++typeReads === 1 ? 'First' : 'harness.model.responded') });
    expect((await appendEvent(world, 'run_once', input as never)).type).toBe('First');
    expect(typeReads).toBe(1);
  });

  it('keep a __proto__ key as a key', async () => {
    const world = makeWorld();
    const payload = JSON.parse('{"__proto__":{"polluted":true},"a":1}') as Record<string, unknown>;
    const stored = await appendEvent(world, 'run_proto', { type: 'T', payload });
    expect(Object.keys(stored.payload).sort()).toEqual(['__proto__', 'a']);
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
  });
});

describe('a stored payload that does not parse', () => {
  it('is an EventLogCorruptError naming the run and sequence when read, and little events says so', async () => {
    const dataDir = tempDir();
    const world = localWorld({ dataDir });
    await appendEvent(world, 'run_bad', { type: 'T', payload: { i: 0 } });
    await appendEvent(world, 'run_bad', { type: 'T', payload: { i: 1 } });
    await world.close();
    const db = new Database(join(dataDir, 'events', 'events.db'));
    const { envelope } = db.prepare("SELECT envelope FROM events WHERE run_id = 'run_bad' AND sequence = 2").get() as { envelope: string };
    db.prepare("UPDATE events SET envelope = ? WHERE run_id = 'run_bad' AND sequence = 2").run(envelope.replace('{"i":1}', '{"i":1'));
    db.close();

    const reopened = track(localWorld({ dataDir }));
    const events = await listEvents(reopened, 'run_bad');
    expect(events[0]!.payload).toEqual({ i: 0 });
    const err = await failure(() => events[1]!.payload);
    expect(err).toBeInstanceOf(EventLogCorruptError);
    expect((err as WorldError).code).toBe('EVENT_LOG_CORRUPT');
    expect((err as WorldError).runId).toBe('run_bad');
    expect((err as WorldError).sequence).toBe(2);
    expect((err as Error).cause).toBeInstanceOf(SyntaxError);
    // Passing the envelope on (canonicalize, validateEventLogShape) keeps the error as it is.
    expect(await failure(() => canonicalize(events[1]))).toBeInstanceOf(EventLogCorruptError);
    expect(await failure(() => validateEventLogShape(events))).toBeInstanceOf(EventLogCorruptError);
    await reopened.close();

    const r = spawnSync(process.execPath, [join(packageRoot, 'bin', 'little.js'), 'events', 'run_bad', '--data-dir', dataDir], { encoding: 'utf8' });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('[EVENT_LOG_CORRUPT]');
    expect(r.stderr).not.toContain('EVENT_VALIDATION');
  });
});

describe('errors at the root of an input', () => {
  it('name no credential a getter was reached through', async () => {
    const world = track(virtualWorld());
    const key = `sk-proj-${'A1b2C3d4'.repeat(6)}`;
    const err = await rejection(appendRunEvent(world, 'run_k', { type: 'run:started', [key]: throwing('x') } as never));
    expectValidation(err, err.path!);
    expect(err.message.includes('A1b2C3d4')).toBe(false);
  });
});
