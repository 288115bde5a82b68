// The event log contract, run against every kind of world.
import { createHash } from 'node:crypto';
import canonicalizeOracle from 'canonicalize';
import { describe, expect, it } from 'vitest';
import {
  appendEvent,
  ArtifactNotFoundError,
  EventAppendIdempotencyConflictError,
  EventLogCorruptError,
  EventValidationError,
  listEvents,
  localWorld,
  validateEventLogShape,
  virtualWorld,
  WorldClosedError,
  WorldError,
  WorldPathError,
  type EventEnvelope,
  type World,
} from '@little-workflow/world';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { asWriter, worldKinds, rejection, tempDir, track } from './helpers';

const jcs = (v: unknown): string => canonicalizeOracle(v) as string;
const sha256hex = (s: string): string => createHash('sha256').update(s, 'utf8').digest('hex');


function isDeepFrozen(v: unknown): boolean {
  if (v === null || typeof v !== 'object') return true;
  return Object.isFrozen(v) && Object.values(v).every(isDeepFrozen);
}

/** A small random JSON value, built from a seeded generator. */
function randomValue(next: () => number, depth = 0): unknown {
  const pick = Math.floor(next() * (depth > 3 ? 4 : 6));
  const str = () => {
    const pool = ['a', 'Z', '0', ' ', '"', '\\', '\n', '\u0001', 'é', '€', '\uE000', '\u{1F600}', '\u2028', '</'];
    let s = '';
    for (let i = Math.floor(next() * 6); i > 0; i--) s += pool[Math.floor(next() * pool.length)];
    return s;
  };
  switch (pick) {
    case 0:
      return null;
    case 1:
      return next() < 0.5;
    case 2: {
      const r = next();
      return r < 0.3 ? Math.floor(next() * 1e6) : r < 0.6 ? (next() - 0.5) * 10 ** Math.floor(next() * 40 - 20) : -0;
    }
    case 3:
      return str();
    case 4:
      return Array.from({ length: Math.floor(next() * 4) }, () => randomValue(next, depth + 1));
    default: {
      const o: Record<string, unknown> = {};
      for (let i = Math.floor(next() * 5); i > 0; i--) o[str()] = randomValue(next, depth + 1);
      return o;
    }
  }
}

function seeded(seed: number): () => number {
  return () => {
    seed = (seed * 1664525 + 1013904223) >>> 0;
    return seed / 2 ** 32;
  };
}

const modelResponded = (turn: number, extra: Record<string, unknown> = {}) => ({
  turn,
  callId: `call_${turn}`,
  model: { provider: 'openai', modelId: 'gpt-5' },
  response: { usage: { inputTokens: 100, outputTokens: 20 } },
  ...extra,
});

describe.each(worldKinds)('event log on %s', (_name, makeWorld) => {
  it('appends dense 1-based sequences and returns deep-frozen envelopes', async () => {
    const world = makeWorld();
    const a = await appendEvent(world, 'run_dense', { type: 'RunStarted', payload: { input: { q: 1 } } });
    const b = await appendEvent(world, 'run_dense', { type: 'StepStarted', payload: { stepPath: 'a' } });
    const other = await appendEvent(world, 'run_other', { type: 'RunStarted', payload: {} });
    expect([a.sequence, b.sequence, other.sequence]).toEqual([1, 2, 1]);
    expect(isDeepFrozen(a)).toBe(true);
    expect(a.recordedAt).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    const listed = await listEvents(world, 'run_dense');
    expect(listed).toEqual([a, b]);
    expect(isDeepFrozen(listed)).toBe(true);
    // Listed envelopes read their payloads lazily, yet stay plain objects to every library.
    expect(listed).toStrictEqual([a, b]);
    expect(Object.getPrototypeOf(listed[0])).toBe(Object.prototype);
    expect({ ...listed[1] }).toEqual({ ...b });
    expect((Object.create(listed[1]) as { payload: unknown }).payload).toBe(listed[1].payload);
    expect(await listEvents(world, 'run_dense', { afterSequence: 1 })).toEqual([b]);
    expect(await listEvents(world, 'run_dense', { limit: 1 })).toEqual([a]);
    expect(await listEvents(world, 'run_none')).toEqual([]);
    validateEventLogShape(listed);
  });

  it('lists a run long enough to be read in several parts as the same envelopes as its pages', async () => {
    // From 40,000 events on, a listing is read in two halves at once, handed over as two parts.
    const world = makeWorld();
    const n = 40_050;
    for (let i = 0; i < n; i += 1000) {
      await Promise.all(
        Array.from({ length: Math.min(1000, n - i) }, (_, j) =>
          appendEvent(world, 'run_long', { type: (i + j) % 3 ? 'custom.a' : 'custom.b', payload: { i: i + j, s: 'é'.repeat((i + j) % 5) }, ...((i + j) % 2 ? { appendIdempotencyKey: `k${i + j}` } : {}) }),
        ),
      );
    }
    const all = await listEvents(world, 'run_long');
    expect(all.length).toBe(n);
    expect(Object.isFrozen(all)).toBe(true);
    let paged: EventEnvelope[] = [];
    for (let after = 0; after < n; after += 10_000) paged = paged.concat(await listEvents(world, 'run_long', { afterSequence: after, limit: 10_000 }));
    const fields = (e: EventEnvelope) => [e.sequence, e.eventId, e.type, e.recordedAt, e.appendIdempotencyKey, e.canonicalRequestDigest].join(' ');
    expect(all.map(fields)).toEqual(paged.map(fields));
    for (const i of [0, 1, 19_999, 20_024, 20_025, 20_026, n - 1]) {
      expect(all[i]).toEqual(paged[i]);
      expect(all[i].payload).toEqual({ i, s: 'é'.repeat(i % 5) });
    }
  }, 60_000);

  it('computes eventId and canonicalRequestDigest as specified, for random payloads', async () => {
    const world = makeWorld();
    const next = seeded(42);
    for (let i = 0; i < 200; i++) {
      const payload = { value: randomValue(next), i };
      const keyed = i % 2 === 0;
      const env = await appendEvent(world, 'run_ids', {
        type: keyed ? 'custom.keyed' : 'custom.fact',
        payload,
        ...(keyed ? { appendIdempotencyKey: `k${i}` } : {}),
      });
      const canonicalPayload = JSON.parse(jcs(payload));
      expect(jcs(env.payload)).toBe(jcs(payload));
      const id = `evt_${sha256hex(jcs({ runId: 'run_ids', sequence: env.sequence, type: env.type, payload: canonicalPayload })).slice(0, 16)}`;
      expect(env.eventId).toBe(id);
      if (keyed) {
        expect(env.canonicalRequestDigest).toBe(`sha256:${sha256hex(jcs({ runId: 'run_ids', type: env.type, payload: canonicalPayload }))}`);
      } else {
        expect(env.canonicalRequestDigest).toBeUndefined();
      }
    }
    const listed = await listEvents(world, 'run_ids');
    // Keyed and unkeyed envelopes alike are plain objects, keys in canonical order.
    for (const env of listed) {
      expect(Object.getPrototypeOf(env)).toBe(Object.prototype);
      expect(Object.keys(env)).toEqual(Object.keys(JSON.parse(jcs(env))));
    }
    validateEventLogShape(listed);
  });

  it('stores long strings and strings that start with U+0000 exactly, wherever they sit', async () => {
    // Long strings cross to the core beside the payload's JSON text, with "\u0000<i>" in their
    // places; nothing a caller writes may be taken for such a placeholder, or lose one.
    const world = makeWorld();
    const next = seeded(7);
    const pool = ['a', '"', '\\', '\n', '\u0001', '\u0000', 'é', '€', '\u{1F600}', '\u2028', '</'];
    const long = (n: number) => {
      let s = '';
      while (s.length < n) s += pool[Math.floor(next() * pool.length)];
      return s;
    };
    const big = long(5000);
    const withJson = { toJSON: () => big };
    const cases: Record<string, unknown>[] = [
      { big },
      { a: [1, big, { b: new String(big), c: withJson }], z: '\u0000x', s: '\u0000', n: '\u00000' },
      { ['\u0000key']: big, nested: { deeper: [[long(4096)], long(4095), '\u00001'] } },
      { short: '\u00000', other: '\u0000' }, // no long string: sent as plain JSON text
    ];
    // Each string crosses as UTF-8 in one write when it is ASCII, and again when it is not: wide
    // characters only at either end, only wide ones, only astral ones (two units each).
    cases.push(
      { ascii: 'x'.repeat(70_000) },
      { endsWide: `${'a'.repeat(5000)}é`, startsWide: `é${'a'.repeat(5000)}` },
      { cjk: '中'.repeat(5000), astral: '\u{1F600}'.repeat(3000), lastAstral: `${'b'.repeat(4999)}\u{1F600}` },
      { text: Array.from({ length: 3000 }, (_, i) => (i === 2999 ? 'é' : 'ab')) }, // long JSON text, no long string
    );
    for (let i = 0; i < 20; i++) cases.push({ i, parts: Array.from({ length: 1 + (i % 4) }, () => long(next() < 0.5 ? 100 : 4000 + Math.floor(next() * 9000))) });
    for (const [i, payload] of cases.entries()) {
      const keyed = i % 2 === 0;
      const env = await appendEvent(world, 'run_long', {
        type: 'custom.long',
        payload,
        ...(keyed ? { appendIdempotencyKey: `k${i}` } : {}),
      });
      const canonicalPayload = JSON.parse(jcs(JSON.parse(JSON.stringify(payload))));
      expect(jcs(env.payload) === jcs(canonicalPayload)).toBe(true);
      const id = `evt_${sha256hex(jcs({ runId: 'run_long', sequence: env.sequence, type: env.type, payload: canonicalPayload })).slice(0, 16)}`;
      expect(env.eventId).toBe(id);
      if (keyed) {
        // An idempotent retry carries its long strings the same way and finds the same event.
        expect(await appendEvent(world, 'run_long', { type: 'custom.long', payload, appendIdempotencyKey: `k${i}` })).toEqual(env);
      }
    }
    const listed = await listEvents(world, 'run_long');
    expect(listed.map((e) => jcs(e.payload)).join('\n') === cases.map((c) => jcs(JSON.parse(JSON.stringify(c)))).join('\n')).toBe(true);
    validateEventLogShape(listed);
  });

  it('stays dense with 50 runs x 200 appends in flight and invalid appends mixed in', async () => {
    const world = makeWorld();
    const runs = Array.from({ length: 50 }, (_, r) => `run_load_${r}`);
    const pending: Promise<unknown>[] = [];
    let invalid = 0;
    for (let i = 0; i < 200; i++) {
      for (const runId of runs) {
        pending.push(appendEvent(world, runId, { type: 'StepStarted', payload: { stepPath: `s${i}` } }));
        if (i % 17 === 0) {
          invalid++;
          pending.push(
            rejection(appendEvent(world, runId, { type: 'StepStarted', payload: { stepPath: 42 } })).then((e) => {
              expect(e).toBeInstanceOf(EventValidationError);
            }),
          );
        }
        if (i % 23 === 0) {
          invalid++;
          pending.push(
            rejection(appendEvent(world, runId, { type: 'x', payload: { usage: { costUsd: 1 } } })).then((e) => {
              expect(e.code).toBe('EVENT_VALIDATION');
            }),
          );
        }
      }
    }
    await Promise.all(pending);
    expect(invalid).toBeGreaterThan(0);
    for (const runId of runs) {
      const events = await listEvents(world, runId);
      expect(events.map((e) => e.sequence)).toEqual(Array.from({ length: 200 }, (_, i) => i + 1));
      expect(events.map((e) => e.payload.stepPath)).toEqual(Array.from({ length: 200 }, (_, i) => `s${i}`));
      validateEventLogShape(events);
    }
  });

  it('answers an idempotent retry with the original envelope and refuses different content', async () => {
    const world = makeWorld();
    const input = { type: 'harness.model.responded', payload: modelResponded(1), appendIdempotencyKey: 'resp-1' };
    const first = await appendEvent(world, 'run_idem', input);
    await appendEvent(world, 'run_idem', { type: 'StepStarted', payload: { stepPath: 'x' } });
    const again = await appendEvent(world, 'run_idem', { ...input, payload: JSON.parse(JSON.stringify(input.payload)) });
    expect(again).toEqual(first);
    const err = await rejection(appendEvent(world, 'run_idem', { ...input, payload: modelResponded(2) }));
    expect(err).toBeInstanceOf(EventAppendIdempotencyConflictError);
    expect(err.code).toBe('EVENT_APPEND_IDEMPOTENCY_CONFLICT');
    expect(err.runId).toBe('run_idem');
    // The same key in another run is another event.
    const elsewhere = await appendEvent(world, 'run_idem_2', input);
    expect(elsewhere.sequence).toBe(1);
    expect((await listEvents(world, 'run_idem')).length).toBe(2);
  });

  it('rejects every bad input with its typed error, writing nothing and consuming no sequence', async () => {
    const world = makeWorld();
    const cyclic: Record<string, unknown> = { a: 1 };
    cyclic.self = { back: cyclic };
    let deep: unknown = {};
    for (let i = 0; i < 1000; i++) deep = { d: deep };
    const bad: Array<[string, () => Promise<unknown>, Function, string | undefined]> = [
      ['NaN', () => appendEvent(world, 'run_bad', { type: 'x', payload: { a: [1, NaN] } }), EventValidationError, 'payload.a[1]'],
      ['Infinity', () => appendEvent(world, 'run_bad', { type: 'x', payload: { b: -Infinity } }), EventValidationError, 'payload.b'],
      ['BigInt', () => appendEvent(world, 'run_bad', { type: 'x', payload: { n: 1n } }), EventValidationError, 'payload.n'],
      ['function', () => appendEvent(world, 'run_bad', { type: 'x', payload: { f() {} } }), EventValidationError, 'payload.f'],
      ['symbol', () => appendEvent(world, 'run_bad', { type: 'x', payload: { s: Symbol('x') } }), EventValidationError, 'payload.s'],
      ['undefined in array', () => appendEvent(world, 'run_bad', { type: 'x', payload: { a: [undefined] } }), EventValidationError, 'payload.a[0]'],
      ['cycle', () => appendEvent(world, 'run_bad', { type: 'x', payload: cyclic }), EventValidationError, 'payload.self.back'],
      ['1001 levels', () => appendEvent(world, 'run_bad', { type: 'x', payload: { deep } }), EventValidationError, undefined],
      ['lone surrogate', () => appendEvent(world, 'run_bad', { type: 'x', payload: { s: 'a\udc00' } }), EventValidationError, 'payload.s'],
      ['costUsd', () => appendEvent(world, 'run_bad', { type: 'x', payload: { r: { usage: { costUsd: 0.1 } } } }), EventValidationError, 'payload.r.usage.costUsd'],
      ['costUsd on a model response', () => appendEvent(world, 'run_bad', { type: 'harness.model.responded', appendIdempotencyKey: 'k', payload: modelResponded(1, { response: { usage: { inputTokens: 1, outputTokens: 1, costUsd: 1 } } }) }), EventValidationError, 'payload.response.usage.costUsd'],
      ['harness without key', () => appendEvent(world, 'run_bad', { type: 'harness.model.responded', payload: modelResponded(1) }), EventValidationError, 'appendIdempotencyKey'],
      ['missing required field', () => appendEvent(world, 'run_bad', { type: 'harness.model.responded', appendIdempotencyKey: 'k2', payload: { turn: 1 } }), EventValidationError, 'payload.callId'],
      ['negative tokens', () => appendEvent(world, 'run_bad', { type: 'harness.model.responded', appendIdempotencyKey: 'k3', payload: modelResponded(1, { response: { usage: { inputTokens: -1, outputTokens: 1 } } }) }), EventValidationError, 'payload.response.usage.inputTokens'],
      ['cached above input', () => appendEvent(world, 'run_bad', { type: 'harness.model.responded', appendIdempotencyKey: 'k4', payload: modelResponded(1, { response: { usage: { inputTokens: 1, outputTokens: 1, cachedInputTokens: 2 } } }) }), EventValidationError, 'payload.response.usage.cachedInputTokens'],
      ['session reasoning above output', () => appendEvent(world, 'run_bad', { type: 'harness.session.completed', appendIdempotencyKey: 'k5', payload: { runId: 'run_child', usage: { inputTokens: 1, outputTokens: 1, cachedInputTokens: 0, reasoningTokens: 70 } } }), EventValidationError, 'payload.usage.reasoningTokens'],
      ['session cached above input', () => appendEvent(world, 'run_bad', { type: 'harness.session.completed', appendIdempotencyKey: 'k6', payload: { runId: 'run_child', usage: { inputTokens: 1, outputTokens: 1, cachedInputTokens: 50, reasoningTokens: 0 } } }), EventValidationError, 'payload.usage.cachedInputTokens'],
      ['payload not an object', () => appendEvent(world, 'run_bad', { type: 'x', payload: [1] as never }), EventValidationError, 'payload'],
      ['missing artifact', () => appendEvent(world, 'run_bad', { type: 'x', payload: { ref: 'artifact://art_0123456789abcdef' } }), ArtifactNotFoundError, 'payload.ref'],
      ['malformed run id', () => appendEvent(world, 'run_../../etc', { type: 'x', payload: {} }), WorldPathError, undefined],
      ['run id too long', () => appendEvent(world, `run_${'a'.repeat(81)}`, { type: 'x', payload: {} }), WorldPathError, undefined],
      ['run id not a string', () => appendEvent(world, 7 as never, { type: 'x', payload: {} }), WorldPathError, undefined],
      ['type not a string', () => appendEvent(world, 'run_bad', { type: 3 as never, payload: {} }), EventValidationError, 'type'],
      ['empty type', () => appendEvent(world, 'run_bad', { type: '', payload: {} }), EventValidationError, 'type'],
      // Crossing into the core as UTF-8, a lone surrogate would become U+FFFD: two keys, one row.
      ['lone surrogate in type', () => appendEvent(world, 'run_bad', { type: 'X\ud800', payload: {} }), EventValidationError, 'type'],
      ['lone surrogate in key', () => appendEvent(world, 'run_bad', { type: 'x', appendIdempotencyKey: 'k\ud800', payload: {} }), EventValidationError, 'appendIdempotencyKey'],
      ['not a world', () => appendEvent({} as never, 'run_bad', { type: 'x', payload: {} }), EventValidationError, 'world'],
      ['options not an object', () => listEvents(world, 'run_bad', null as never), EventValidationError, 'listEvents options'],
      ['options an array', () => listEvents(world, 'run_bad', [] as never), EventValidationError, 'listEvents options'],
    ];
    for (const [name, attempt, cls, path] of bad) {
      const err = await rejection(attempt());
      expect(err, name).toBeInstanceOf(cls);
      expect(err, name).toBeInstanceOf(WorldError);
      expect(typeof err.code, name).toBe('string');
      if (path !== undefined) expect(err.path, name).toBe(path);
    }
    expect(await listEvents(world, 'run_bad')).toEqual([]);
    const ok = await appendEvent(world, 'run_bad', { type: 'x', payload: { fine: true } });
    expect(ok.sequence).toBe(1);
  });

  it('omits undefined fields and honours toJSON, as JSON does', async () => {
    const world = makeWorld();
    const at = new Date('2026-01-02T03:04:05.678Z');
    const env = await appendEvent(world, 'run_json', { type: 'x', payload: { at, gone: undefined, n: -0, nested: { toJSON: () => ['y'] } } });
    expect(env.payload).toEqual({ at: '2026-01-02T03:04:05.678Z', n: 0, nested: ['y'] });
  });

  it('rejects calls on a closed world with WorldClosedError', async () => {
    const world = makeWorld();
    await appendEvent(world, 'run_c', { type: 'x', payload: {} });
    await world.close();
    await world.close();
    const err = await rejection(appendEvent(world, 'run_c', { type: 'x', payload: {} }));
    expect(err).toBeInstanceOf(WorldClosedError);
    expect(err.code).toBe('WORLD_CLOSED');
    expect(await rejection(listEvents(world, 'run_c'))).toBeInstanceOf(WorldClosedError);
  });
});

describe('a keyed retry after an upgrade', () => {
  // A runtime resuming after an upgrade retries what it may have committed. A rule added since
  // (here: a session's cached tokens cannot exceed its input tokens) must not refuse the retry
  // of an append an earlier version stored: it gets the stored envelope back.
  it('returns the envelope an earlier version stored, though this version refuses its payload', async () => {
    const dataDir = tempDir();
    await track(localWorld({ dataDir })).close();
    const runId = 'run_upgraded';
    const type = 'harness.session.completed';
    const key = 'session-1';
    const payload = { runId: 'run_child', usage: { inputTokens: 10, outputTokens: 1, cachedInputTokens: 20, reasoningTokens: 0 } };
    const digest = `sha256:${sha256hex(jcs({ runId, type, payload }))}`;
    const eventId = `evt_${sha256hex(jcs({ runId, sequence: 1, type, payload })).slice(0, 16)}`;
    const recordedAt = '2026-11-01T00:00:00.000Z';
    const envelope = jcs({ eventId, runId, sequence: 1, type, appendIdempotencyKey: key, canonicalRequestDigest: digest, recordedAt, payload });
    const db = asWriter(new Database(join(dataDir, 'events', 'events.db')));
    db.prepare('INSERT INTO events (run_id, sequence, event_id, type, idempotency_key, request_digest, recorded_at, envelope) VALUES (?, ?, ?, ?, ?, ?, ?, ?)')
      .run(runId, 1, eventId, type, key, digest, recordedAt, envelope);
    db.close();

    const world = track(localWorld({ dataDir }));
    const retry = await appendEvent(world, runId, { type, appendIdempotencyKey: key, payload });
    expect(retry.eventId).toBe(eventId);
    expect(retry.recordedAt).toBe(recordedAt);
    // Anything else with that payload is refused for it, and nothing is written.
    for (const [k, p] of [['session-2', payload], [key, { ...payload, usage: { ...payload.usage, cachedInputTokens: 30 } }]] as const) {
      const err = await rejection(appendEvent(world, runId, { type, appendIdempotencyKey: k, payload: p }));
      expect(err).toBeInstanceOf(EventValidationError);
      expect(err.path).toBe('payload.usage.cachedInputTokens');
    }
    expect((await listEvents(world, runId)).length).toBe(1);
  });
});

describe('opening a world', () => {
  it('refuses options that are not an object with a typed error', () => {
    for (const open of [() => localWorld('/tmp/x' as never), () => virtualWorld(7 as never)]) {
      let err: unknown;
      try {
        open();
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(EventValidationError);
      expect((err as WorldError).code).toBe('EVENT_VALIDATION');
    }
  });
});

describe('validateEventLogShape', () => {
  async function someLog(world: World): Promise<EventEnvelope[]> {
    for (let i = 0; i < 3; i++) await appendEvent(world, 'run_shape', { type: 'StepStarted', payload: { stepPath: `s${i}` } });
    return JSON.parse(JSON.stringify(await listEvents(world, 'run_shape')));
  }

  it('finds holes, reordering, other runs and tampered payloads', async () => {
    const world = worldKinds[2][1]();
    const log = await someLog(world);
    validateEventLogShape(log);
    const cases: Array<[string, EventEnvelope[]]> = [
      ['hole', [log[0], log[2]]],
      ['reordered', [log[1], log[0], log[2]]],
      ['duplicate', [log[0], log[0]]],
      ['starts at 2', [log[1]]],
      ['tampered payload', [log[0], { ...log[1], payload: { stepPath: 'evil' } }, log[2]]],
      ['tampered id', [{ ...log[0], eventId: 'evt_0000000000000000' }]],
      ['other run', [log[0], { ...log[1], runId: 'run_else' }]],
      ['not envelopes', [{} as EventEnvelope]],
    ];
    for (const [name, events] of cases) {
      let caught: unknown;
      try {
        validateEventLogShape(events);
      } catch (e) {
        caught = e;
      }
      expect(caught, name).toBeInstanceOf(EventLogCorruptError);
      expect((caught as WorldError).code, name).toBe('EVENT_LOG_CORRUPT');
    }
  });
});
