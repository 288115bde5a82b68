// Generated inputs, on every kind of world: random JSON payloads (with keys such as `__proto__`
// and `constructor` among them) come back exactly as an independent canonicalizer writes them,
// with the event id it hashes to; hostile values always get a WorldError; run-event drafts are
// accepted exactly when they are valid. Through the Vercel World, generated values come back
// from every place the SDK stores one, own `__proto__` keys included.
//
// Bounded to a few seconds here. `node scripts/property-soak.mjs --duration 10m` runs the same
// properties for as long as it is given (through LITTLE_PROPERTY_SECONDS).
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import canonicalizeOracle from 'canonicalize';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  appendEvent,
  appendRunEvent,
  appendSessionEvent,
  canonicalize,
  listEvents,
  localWorld,
  validateEventLogShape,
  WorldError,
  writeArtifact,
  type World,
} from '@little-workflow/world';
import { createWorld } from '@little-workflow/world/vercel';
import { sameValue, tempDir, worldKinds } from './helpers';

const SECONDS = Number(process.env.LITTLE_PROPERTY_SECONDS ?? 0);
/** `numRuns` runs, or as many as fit in LITTLE_PROPERTY_SECONDS when that is set. */
const runs = (numRuns: number): fc.Parameters<unknown> =>
  SECONDS > 0 ? { numRuns: Number.MAX_SAFE_INTEGER, interruptAfterTimeLimit: SECONDS * 1000, markInterruptAsFailure: false } : { numRuns };
const TIMEOUT = SECONDS > 0 ? SECONDS * 1000 + 60_000 : 60_000;

const oracle = (v: unknown) => canonicalizeOracle(v) as string;
const sha256hex = (s: string) => createHash('sha256').update(s).digest('hex');

let streams = 0;
const fresh = (prefix: 'run' | 'ses') => `${prefix}_p${process.pid}_${streams++}`;

function hasLoneSurrogate(v: unknown): boolean {
  if (typeof v === 'string') return !v.isWellFormed();
  if (Array.isArray(v)) return v.some(hasLoneSurrogate);
  if (v !== null && typeof v === 'object') return Object.entries(v).some(([k, x]) => !k.isWellFormed() || hasLoneSurrogate(x));
  return false;
}

/** The outcome of a call: its value, or what it threw or rejected with. */
async function outcome(f: () => unknown): Promise<{ ok: true; value: unknown } | { ok: false; error: unknown }> {
  try {
    return { ok: true, value: await f() };
  } catch (error) {
    return { ok: false, error };
  }
}

/** Ways to build a value that misbehaves as it is read (built fresh for each call). */
const MAKERS: ReadonlyArray<() => unknown> = [
  () => Number.NaN,
  () => Number.POSITIVE_INFINITY,
  () => -Number.POSITIVE_INFINITY,
  () => 10n,
  () => Symbol('s'),
  () => () => 1,
  () => undefined,
  () => new Map([[1, 2]]),
  () => new Set([1]),
  () => new Date(0),
  () => '\ud800',
  () => ({ toJSON: () => undefined }),
  () => ({
    toJSON() {
      throw new RangeError('no');
    },
  }),
  () =>
    Object.defineProperty({}, 'x', {
      enumerable: true,
      get() {
        throw new Error('getter');
      },
    }),
  () => {
    const { proxy, revoke } = Proxy.revocable({}, {});
    revoke();
    return proxy;
  },
  () => new Proxy({}, { ownKeys: () => { throw new TypeError('keys'); } }),
  () => {
    const o: Record<string, unknown> = {};
    o.self = o;
    return o;
  },
  () => Object.create(null) as object,
  () => new Uint8Array([1, 2]),
];

/**
 * A recipe for a hostile value: plain JSON, one of the makers, or arrays and objects of those.
 * Recipes are plain data (fast-check itself cannot handle a revoked Proxy); {@link build} makes
 * the value.
 */
type Recipe = { json: unknown } | { make: number } | { array: Recipe[] } | { object: Array<[string, Recipe]> };
const recipes: fc.Arbitrary<Recipe> = fc.letrec<{ recipe: Recipe }>((tie) => ({
  recipe: fc.oneof(
    { depthSize: 'small' },
    fc.jsonValue({ maxDepth: 2 }).map((json) => ({ json })),
    fc.nat({ max: MAKERS.length - 1 }).map((make) => ({ make })),
    fc.array(tie('recipe'), { maxLength: 3 }).map((array) => ({ array })),
    fc.array(fc.tuple(fc.string({ maxLength: 4 }), tie('recipe')), { maxLength: 3 }).map((object) => ({ object })),
  ),
})).recipe;

function build(r: Recipe): unknown {
  if ('json' in r) return r.json;
  if ('make' in r) return MAKERS[r.make]!();
  if ('array' in r) return r.array.map(build);
  const o: Record<string, unknown> = {};
  for (const [k, v] of r.object) o[k] = build(v);
  return o;
}

/**
 * Keys an object built by assignment or looked up through its prototype gets wrong: `__proto__`
 * (assigned, it sets the prototype and the field is gone), the names of Object's methods, and the
 * markers of the Vercel World's encoding; besides short ordinary ones.
 */
const trickyKeys = fc.oneof(
  fc.constantFrom('__proto__', 'constructor', 'toString', 'valueOf', 'hasOwnProperty', 'toJSON', '$bytes', '$date', '$esc', '$artifact'),
  fc.string({ maxLength: 4 }),
);

/** JSON objects with such keys as own keys, some without a prototype. */
const trickyJson = fc.object({
  key: trickyKeys,
  values: [fc.boolean(), fc.integer(), fc.string({ maxLength: 6 }), fc.constant(null)],
  maxDepth: 3,
  maxKeys: 4,
  withNullPrototype: true,
});

/** What the SDK hands a World: the same, with bytes and dates among the values. */
const trickySdkValues = fc.object({
  key: trickyKeys,
  values: [fc.boolean(), fc.integer(), fc.string({ maxLength: 6 }), fc.constant(null), fc.uint8Array({ maxLength: 6 }), fc.date({ noInvalidDate: true })],
  maxDepth: 3,
  maxKeys: 4,
  withNullPrototype: true,
});

type Fixture = { types: Record<string, { stream: 'run' | 'session'; valid: Record<string, unknown>; invalid: { draft: Record<string, unknown>; path: string } }> };
const fixture = JSON.parse(readFileSync(join(__dirname, 'fixtures', 'run-event-examples.json'), 'utf8')) as Fixture;
const TYPES = Object.keys(fixture.types);

/** Fields any run event may carry besides its own: names no event gives a meaning, and plain values. */
const extras = fc.dictionary(
  fc.stringMatching(/^x_[a-z]{1,6}$/),
  fc.oneof(fc.integer(), fc.boolean(), fc.stringMatching(/^[a-z ]{0,12}$/), fc.constant(null)),
  { maxKeys: 3 },
);

/** A draft of a known type, valid or not by construction, with extra fields that change neither. */
const drafts = fc.record({
  type: fc.constantFrom(...TYPES),
  valid: fc.boolean(),
  extra: extras,
  unknownType: fc.boolean(),
});

describe.each(worldKinds)('generated inputs on %s', (_name, makeWorld) => {
  it('store random JSON payloads exactly as an independent canonicalizer writes them', { timeout: TIMEOUT }, async () => {
    const world = makeWorld();
    const payloads = fc.oneof(fc.jsonValue({ maxDepth: 4 }), fc.jsonValue({ maxDepth: 3, stringUnit: 'binary' }), trickyJson);
    await fc.assert(
      fc.asyncProperty(fc.array(payloads, { minLength: 1, maxLength: 6 }), async (values) => {
        const runId = fresh('run');
        const results = await Promise.all(values.map((v) => outcome(() => appendEvent(world, runId, { type: 'Fact', payload: { v } }))));
        const kept: unknown[] = [];
        for (const [i, r] of results.entries()) {
          if (hasLoneSurrogate(values[i])) {
            expect(r.ok).toBe(false);
            expect(!r.ok && r.error).toBeInstanceOf(WorldError);
            continue;
          }
          expect(r.ok, String(!r.ok && r.error)).toBe(true);
          kept.push(values[i]);
        }
        const listed = await listEvents(world, runId);
        expect(listed.length).toBe(kept.length);
        const appended = results.filter((r) => r.ok).map((r) => (r as { value: unknown }).value as (typeof listed)[number]);
        for (const [i, e] of listed.entries()) {
          const payload = { v: kept[i] };
          expect(canonicalize(e.payload)).toBe(oracle(payload));
          expect(sameValue(e.payload, payload), JSON.stringify(e.payload)).toBe(true);
          expect(oracle(e)).toBe(oracle(appended.find((a) => a.sequence === e.sequence)));
          const { eventId, ...rest } = e;
          expect(eventId).toBe(`evt_${sha256hex(oracle({ runId, sequence: rest.sequence, type: rest.type, payload }))}`.slice(0, 20));
        }
        validateEventLogShape(listed);
      }),
      runs(100),
    );
  });

  it('answer hostile values with a WorldError, and nothing else', { timeout: TIMEOUT }, async () => {
    const world = makeWorld();
    const calls = (w: World, v: () => unknown): Array<() => unknown> => [
      () => appendEvent(w, fresh('run'), { type: 'Fact', payload: { v: v() } }),
      () => appendEvent(w, fresh('run'), v() as never),
      () => appendEvent(w, fresh('run'), { type: 'StepCompleted', payload: { stepPath: 's', output: v() } }),
      () => appendRunEvent(w, fresh('run'), { type: 'node:started', nodeId: 'n', nodeType: 'agent', extra: v() } as never),
      () => writeArtifact(w, { runId: 'run_h', stepPath: 's', name: 'n', contentType: 'application/json', encoding: 'json', payload: v() }),
      () => listEvents(w, 'run_h', v() as never),
      () => canonicalize(v()),
    ];
    await fc.assert(
      fc.asyncProperty(recipes, async (recipe) => {
        for (const call of calls(world, () => build(recipe))) {
          const r = await outcome(call);
          if (!r.ok) expect(r.error, String(r.error)).toBeInstanceOf(WorldError);
        }
      }),
      runs(150),
    );
  });

  it('accept run-event drafts exactly when they are valid', { timeout: TIMEOUT }, async () => {
    const world = makeWorld();
    await fc.assert(
      fc.asyncProperty(drafts, async ({ type, valid, extra, unknownType }) => {
        const entry = fixture.types[type]!;
        const base = valid ? entry.valid : entry.invalid.draft;
        const draft = { ...extra, ...base, ...(unknownType ? { type: `${type}_unknown` } : {}) };
        const stream = fresh(entry.stream === 'session' ? 'ses' : 'run');
        // A release gives back what was committed before it in the same stream.
        if (type === 'budget:estimate_released') await appendRunEvent(world, stream, fixture.types['budget:estimate_committed']!.valid as never);
        const r = await outcome(() =>
          entry.stream === 'session' ? appendSessionEvent(world, stream, draft as never) : appendRunEvent(world, stream, draft as never),
        );
        const expected = valid && !unknownType;
        expect(r.ok, `${type} (${valid ? 'valid' : 'invalid'}${unknownType ? ', unknown type' : ''}): ${!r.ok ? String(r.error) : 'accepted'}`).toBe(expected);
        if (!r.ok) {
          expect(r.error).toBeInstanceOf(WorldError);
          expect((r.error as WorldError).code).toBe('EVENT_VALIDATION');
        }
      }),
      runs(200),
    );
  });
});

describe('generated values through the Vercel World', () => {
  it("come back from a run's input, a step's result, a hook's payload and a queue's body as they went in", { timeout: TIMEOUT }, async () => {
    const store = localWorld({ dataDir: tempDir(), durability: 'normal' });
    const world = createWorld({ world: store });
    try {
      await fc.assert(
        fc.asyncProperty(trickySdkValues, async (value) => {
          const created = (await world.events.create(null, { eventType: 'run_created', eventData: { deploymentId: 'd', workflowName: 'wf', input: value } } as never)) as { run: { runId: string } };
          const id = created.run.runId;
          await world.events.create(id, { eventType: 'step_created', correlationId: 'step_1', eventData: { stepName: 's', input: new Uint8Array([1]) } } as never);
          await world.events.create(id, { eventType: 'step_started', correlationId: 'step_1' } as never);
          await world.events.create(id, { eventType: 'step_completed', correlationId: 'step_1', eventData: { result: value } } as never);
          await world.events.create(id, { eventType: 'hook_created', correlationId: 'hook_1', eventData: { token: `tok-${id}` } } as never);
          await world.events.create(id, { eventType: 'hook_received', correlationId: 'hook_1', eventData: { payload: value } } as never);
          let received!: (message: unknown) => void;
          const message = new Promise<unknown>((resolve) => (received = resolve));
          world.registerHandler(
            '__wkf_step_',
            world.createQueueHandler('__wkf_step_', async (m) => {
              received(m);
            }),
          );
          await world.queue('__wkf_step_p' as never, value as never);
          const events = (await world.events.list({ runId: id, pagination: { limit: 100 } } as never)).data as { eventType: string; eventData?: Record<string, unknown> }[];
          const back = {
            runInput: (await world.runs.get(id)).input,
            stepResult: (await world.steps.get(id, 'step_1')).output,
            hookPayload: events.find((e) => e.eventType === 'hook_received')?.eventData?.payload,
            queueBody: await message,
          };
          for (const [what, v] of Object.entries(back)) expect(sameValue(v, value), `${what}: ${fc.stringify(v)}`).toBe(true);
        }),
        runs(40),
      );
    } finally {
      await world.close();
      await store.close();
    }
  });
});
