// The materializer: hand-computed runs, the same state through every path, and pricing.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  appendEvent,
  bundledPricing,
  canonicalize,
  EventLogCorruptError,
  EventValidationError,
  listEvents,
  listRuns,
  localWorld,
  materializeRunState,
  materializeRunStateFromEvents,
  virtualWorld,
  writeArtifact,
  type EventEnvelope,
  type PricingRegistry,
} from '@little-workflow/world';
import { rejection, tempDir, track, worldKindsWith } from './helpers';

type Case = {
  name: string;
  runId: string;
  events: Array<{ type: string; payload: Record<string, unknown>; appendIdempotencyKey?: string; recordedAt: string }>;
  expected: Record<string, unknown>;
};
const fixture = JSON.parse(readFileSync(join(__dirname, 'fixtures', 'materialize-cases.json'), 'utf8')) as {
  pricing: PricingRegistry;
  cases: Case[];
};

function envelopes(c: Case): EventEnvelope[] {
  return c.events.map((e, i) => ({
    eventId: 'evt_0000000000000000',
    runId: c.runId,
    sequence: i + 1,
    type: e.type,
    recordedAt: e.recordedAt,
    payload: e.payload,
    ...(e.appendIdempotencyKey ? { appendIdempotencyKey: e.appendIdempotencyKey } : {}),
  }));
}

describe('materializeRunStateFromEvents', () => {
  it.each(fixture.cases.map((c) => [c.name, c] as const))('%s', (_name, c) => {
    const state = materializeRunStateFromEvents(c.runId, envelopes(c), { pricing: fixture.pricing });
    expect(state).toEqual(c.expected);
    expect(Object.isFrozen(state.usage)).toBe(true);
  });

  it('never adds a session rollup: the totals equal the model calls alone', () => {
    const c = fixture.cases.find((x) => x.runId === 'run_rollup')!;
    const withRollup = materializeRunStateFromEvents(c.runId, envelopes(c), { pricing: fixture.pricing });
    const calls = c.events.filter((e) => e.type === 'harness.model.responded');
    const input = calls.reduce((n, e) => n + ((e.payload.response as { usage: { inputTokens: number } }).usage.inputTokens), 0);
    expect(withRollup.usage.inputTokens).toBe(input);
    const withoutRollup = { ...c, events: c.events.filter((e) => e.type !== 'harness.session.completed') };
    const other = materializeRunStateFromEvents(c.runId, envelopes(withoutRollup as Case).map((e, i) => ({ ...e, sequence: i + 1 })), { pricing: fixture.pricing });
    expect(withRollup.usage).toEqual(other.usage);
  });

  it('gives the same bytes for the same events, every time', () => {
    for (const c of fixture.cases) {
      const a = canonicalize(materializeRunStateFromEvents(c.runId, envelopes(c), { pricing: fixture.pricing }));
      const b = canonicalize(materializeRunStateFromEvents(c.runId, JSON.parse(JSON.stringify(envelopes(c))), { pricing: fixture.pricing }));
      expect(a).toBe(b);
    }
  });

  it('refuses a log with a hole, and a bad registry', () => {
    const c = fixture.cases[0];
    const events = envelopes(c);
    expect(() => materializeRunStateFromEvents(c.runId, [events[0], events[2]])).toThrow(EventLogCorruptError);
    let err: unknown;
    try {
      materializeRunStateFromEvents(c.runId, events, { pricing: { models: [{ provider: 'x', modelId: 'y', inputPerMTok: -1, outputPerMTok: 1 }] } });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(EventValidationError);
    expect((err as EventValidationError).path).toBe('pricing.models[0].inputPerMTok');
  });
});

describe.each(worldKindsWith({ pricing: fixture.pricing }))('materializeRunState on %s', (_name, makeWorld) => {
  it('folds stored rows to the same bytes as the events listed through world.ts', async () => {
    const world = makeWorld();
    // The fixture names placeholder artifacts; a world only accepts references to real ones.
    const refs = new Map<string, string>();
    for (const placeholder of ['artifact://art_00000000000000aa', 'artifact://art_00000000000000bb']) {
      const m = await writeArtifact(world, { runId: 'run_refs', stepPath: 'x', name: placeholder, contentType: 'text/plain', encoding: 'utf8', payload: placeholder });
      refs.set(placeholder, m.artifactRef);
    }
    const real = <T>(v: T): T => JSON.parse(JSON.stringify(v), (_k, x) => (typeof x === 'string' && refs.has(x) ? refs.get(x) : x));
    for (const fixtureCase of fixture.cases) {
      const c = real(fixtureCase);
      for (const e of c.events) {
        await appendEvent(world, c.runId, { type: e.type, payload: e.payload, appendIdempotencyKey: e.appendIdempotencyKey });
      }
      const listed = await listEvents(world, c.runId);
      const fromRows = await materializeRunState(world, c.runId);
      const fromEvents = materializeRunStateFromEvents(c.runId, listed, { pricing: fixture.pricing });
      expect(canonicalize(fromRows)).toBe(canonicalize(fromEvents));
      // The world stamps its own recordedAt; with those in place of the fixture's, the state is the
      // hand-computed one.
      const times = new Map(c.events.map((e, i) => [e.recordedAt, listed[i].recordedAt]));
      const expected = JSON.parse(JSON.stringify(c.expected), (_k, v) => (typeof v === 'string' && times.has(v) ? times.get(v) : v));
      expect(fromRows).toEqual(expected);
    }
  });

  it('folds a run long enough to be read on a second thread to the same bytes', async () => {
    const world = makeWorld();
    const n = 9000;
    for (let i = 0; i < n; i += 1000) {
      await Promise.all(
        Array.from({ length: 1000 }, (_, j) => {
          const k = i + j;
          const step = `step/${k % 23}`;
          if (k % 3 === 0) return appendEvent(world, 'run_long', { type: 'StepStarted', payload: { stepPath: step } });
          if (k % 3 === 1) {
            return appendEvent(world, 'run_long', {
              type: 'harness.model.responded',
              payload: { turn: 1, callId: `c${k}`, stepPath: step, model: { provider: 'openai', modelId: 'gpt-5' }, response: { text: 'ok', usage: { inputTokens: 1000 + k, outputTokens: 7 } } },
              appendIdempotencyKey: `call-${k}`,
            });
          }
          return appendEvent(world, 'run_long', { type: 'StepCompleted', payload: { stepPath: step, output: { k } } });
        }),
      );
    }
    const fromRows = await materializeRunState(world, 'run_long');
    expect(fromRows.eventCount).toBe(n);
    expect(canonicalize(fromRows)).toBe(canonicalize(materializeRunStateFromEvents('run_long', await listEvents(world, 'run_long'), { pricing: fixture.pricing })));
  });

  // Sums are exact: a token total past what a number holds exactly used to wrap around (or round).
  it('refuses a call that would take a token total past 2^53 - 1, so the run always folds', async () => {
    const world = makeWorld();
    const call = (run: string, i: number, usage: Record<string, number>) =>
      appendEvent(world, run, {
        type: 'harness.model.responded',
        payload: { turn: i, callId: `c${i}`, model: { provider: 'openai', modelId: 'gpt-5' }, response: { usage } },
        appendIdempotencyKey: `c${i}`,
      });
    const max = Number.MAX_SAFE_INTEGER;
    const first = await call('run_tokens', 1, { inputTokens: max - 10, outputTokens: 1 });
    // Refused, each for the count that would pass: nothing stored, no sequence taken.
    for (const [usage, field] of [
      [{ inputTokens: 11, outputTokens: 1 }, 'inputTokens'],
      [{ inputTokens: 1, outputTokens: max }, 'outputTokens'],
    ] as const) {
      const err = await rejection(call('run_tokens', 2, usage));
      expect(err).toBeInstanceOf(EventValidationError);
      expect(err.path).toBe(`payload.response.usage.${field}`);
    }
    // Two issued together, which only together pass it: the first is taken, the second refused.
    const both = await Promise.allSettled([call('run_tokens', 3, { inputTokens: 6, outputTokens: 1 }), call('run_tokens', 4, { inputTokens: 6, outputTokens: 1 })]);
    expect(both.map((r) => r.status)).toEqual(['fulfilled', 'rejected']);
    // A retry of a call already stored still gets it back.
    expect((await call('run_tokens', 1, { inputTokens: max - 10, outputTokens: 1 })).sequence).toBe(first.sequence);
    const state = await materializeRunState(world, 'run_tokens');
    expect(state.usage.inputTokens).toBe(max - 4);
    expect((await listEvents(world, 'run_tokens')).map((e) => e.sequence)).toEqual([1, 2]);
    expect((await listRuns(world)).find((r) => r.runId === 'run_tokens')!.status).not.toBe('unreadable');
    // Totals are per run.
    await call('run_other', 1, { inputTokens: max, outputTokens: max, cachedInputTokens: max, reasoningTokens: max });
    expect((await materializeRunState(world, 'run_other')).usage.inputTokens).toBe(max);

    // A log no world accepted (built by hand) is still refused by the pure fold, not wrapped.
    const events = await listEvents(world, 'run_tokens');
    const forged = [...events, { ...events[0]!, sequence: 3 }];
    const err = await rejection(Promise.resolve().then(() => materializeRunStateFromEvents('run_tokens', forged)));
    expect(err).toBeInstanceOf(EventLogCorruptError);
  });
});

describe('usage by model', () => {
  it('keeps models apart whose provider and model id join to the same text', () => {
    const call = (seq: number, provider: string, modelId: string) => ({
      eventId: '', runId: 'run_keys', sequence: seq, type: 'harness.model.responded', recordedAt: '2026-06-01T00:00:00.000Z',
      appendIdempotencyKey: `k${seq}`, canonicalRequestDigest: '',
      payload: { turn: seq, callId: `c${seq}`, model: { provider, modelId }, response: { usage: { inputTokens: 1_000_000, outputTokens: 0 } } },
    });
    const pricing: PricingRegistry = { models: [{ provider: 'openrouter', modelId: 'meta/llama', inputPerMTok: 2, outputPerMTok: 2 }] };
    const world = track(virtualWorld({ pricing }));
    return (async () => {
      for (const [i, [provider, modelId]] of [['openrouter', 'meta/llama'], ['openrouter/meta', 'llama'], ['open%2Frouter', 'x']].entries()) {
        await appendEvent(world, 'run_keys', { type: 'harness.model.responded', appendIdempotencyKey: `k${i}`, payload: call(i + 1, provider!, modelId!).payload });
      }
      const state = await materializeRunState(world, 'run_keys');
      expect(Object.keys(state.usageByModel).sort()).toEqual(['open%252Frouter/x', 'openrouter%2Fmeta/llama', 'openrouter/meta/llama']);
      expect(state.usageByModel['openrouter/meta/llama']!.costUsd).toBe(2);
      expect(state.usageByModel['openrouter%2Fmeta/llama']!.costUsd).toBeNull();
      expect(state.usageByModel['openrouter%2Fmeta/llama']!.unpricedCalls).toBe(1);
    })();
  });
});

describe('pricing', () => {
  it('bundles a dated registry with a source page for every entry, covering four providers', () => {
    const reg = bundledPricing();
    expect(reg.asOf).toMatch(/^\d{4}-\d\d-\d\d$/);
    const providers = new Set(reg.models.map((m) => m.provider));
    for (const p of ['openai', 'anthropic', 'google', 'deepseek']) expect(providers.has(p)).toBe(true);
    for (const m of reg.models) {
      expect(m.source, m.modelId).toMatch(/^https:\/\//);
      expect(m.inputPerMTok).toBeGreaterThan(0);
      expect(m.outputPerMTok).toBeGreaterThan(0);
    }
    // A fresh copy each time: callers cannot change the bundled registry.
    reg.models.length = 0;
    expect(bundledPricing().models.length).toBeGreaterThan(20);
  });

  it('merges a world registry over the bundled one', async () => {
    const pricing: PricingRegistry = { asOf: 'mine', models: [{ provider: 'acme', modelId: 'm1', inputPerMTok: 1, outputPerMTok: 2 }] };
    for (const world of [track(virtualWorld({ pricing })), track(localWorld({ dataDir: tempDir(), pricing }))]) {
      for (const [i, model] of [['acme', 'm1'], ['openai', 'gpt-5'], ['acme', 'm2']].entries()) {
        await appendEvent(world, 'run_p', {
          type: 'harness.model.responded',
          appendIdempotencyKey: `k${i}`,
          payload: { turn: 1, callId: `c${i}`, model: { provider: model[0], modelId: model[1] }, response: { usage: { inputTokens: 1_000_000, outputTokens: 1_000_000 } } },
        });
      }
      const state = await materializeRunState(world, 'run_p');
      expect(state.pricingAsOf).toBe('mine');
      expect(state.usageByModel['acme/m1'].costUsd).toBe(3);
      expect(state.usageByModel['openai/gpt-5'].costUsd).toBe(11.25);
      expect(state.usageByModel['acme/m2'].costUsd).toBeNull();
      expect(state.usage.costUsd).toBe(14.25);
      expect(state.usage.pricedCalls).toBe(2);
      expect(state.usage.unpricedCalls).toBe(1);
    }
  });

  it('prices each call by the registry entry in effect when it was recorded', async () => {
    const day = 24 * 3600 * 1000;
    const iso = (ms: number) => new Date(ms).toISOString();
    const pricing: PricingRegistry = {
      models: [
        { provider: 'acme', modelId: 'm1', inputPerMTok: 1, outputPerMTok: 2 },
        { provider: 'acme', modelId: 'm1', inputPerMTok: 100, outputPerMTok: 200, effectiveFrom: iso(Date.now() + day) },
        { provider: 'acme', modelId: 'm0', inputPerMTok: 5, outputPerMTok: 5, effectiveFrom: iso(Date.now() - day).slice(0, 10) },
        { provider: 'acme', modelId: 'soon', inputPerMTok: 1, outputPerMTok: 1, effectiveFrom: iso(Date.now() + day) },
      ],
    };
    for (const world of [track(virtualWorld({ pricing })), track(localWorld({ dataDir: tempDir(), pricing }))]) {
      for (const [i, modelId] of ['m1', 'm0', 'soon'].entries()) {
        await appendEvent(world, 'run_dated', {
          type: 'harness.model.responded',
          appendIdempotencyKey: `k${i}`,
          payload: { turn: 1, callId: `c${i}`, model: { provider: 'acme', modelId }, response: { usage: { inputTokens: 1_000_000, outputTokens: 1_000_000 } } },
        });
      }
      const state = await materializeRunState(world, 'run_dated');
      expect(state.usageByModel['acme/m1'].costUsd, 'the price of today, not of tomorrow').toBe(3);
      expect(state.usageByModel['acme/m0'].costUsd).toBe(10);
      expect(state.usageByModel['acme/soon'].costUsd, 'not priced yet: null, never a guess').toBeNull();
    }
    const bad = { models: [{ provider: 'a', modelId: 'b', inputPerMTok: 1, outputPerMTok: 1, effectiveFrom: 'soon' }] };
    let err: unknown;
    try {
      track(virtualWorld({ pricing: bad }));
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(EventValidationError);
    expect((err as EventValidationError).code).toBe('EVENT_VALIDATION');
    expect((err as EventValidationError).path).toBe('pricing.models[0].effectiveFrom');
  });
});
