// The run-event contract: strict writes, no secrets, tolerant and strict reads, the cost restore
// and the fold, through world.ts on every kind of world.
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { describe, expect, it } from 'vitest';
import {
  appendEvent,
  appendRunEvent,
  appendSessionEvent,
  canonicalize,
  EventAppendIdempotencyConflictError,
  EventLogCorruptError,
  EventValidationError,
  foldRunEvents,
  listEvents,
  listRunEvents,
  loadRunEventLogForReplay,
  listRuns,
  localWorld,
  materializeRunState,
  materializeRunStateFromEvents,
  ReplayRefusedError,
  restoreRunCosts,
  WorldError,
  validateEventLogShape,
  verifyWorld,
  type RunEvent,
  type RunEventDraft,
} from '@little-workflow/world';
import { asWriter, downgradeToSchema2, packageRoot, SCHEMA_VERSION, schemaVersion, tempDir, track, worldKinds, rejection } from './helpers';

type Examples = { types: Record<string, { stream: 'run' | 'session'; valid: RunEventDraft; invalid: { draft: RunEventDraft; path: string } }> };
const examples = JSON.parse(readFileSync(join(__dirname, 'fixtures', 'run-event-examples.json'), 'utf8')) as Examples;
const UUID = '3f2b8c1e-9a4d-4e6f-8b2a-1c3d5e7f9a0b';


describe.each(worldKinds)('run events on %s', (_name, makeWorld) => {
  it('accepts a valid and refuses an invalid example of every type of both unions', async () => {
    const world = makeWorld();
    const types = Object.entries(examples.types);
    expect(types.length).toBeGreaterThanOrEqual(34);
    let n = 0;
    for (const [type, ex] of types) {
      const id = `${ex.stream === 'session' ? 'ses' : 'run'}_ex_${n++}`;
      const append = (d: RunEventDraft) => (ex.stream === 'session' ? appendSessionEvent(world, id, d) : appendRunEvent(world, id, d));
      // A release gives back part of a commitment, which comes first.
      const v = ex.valid as Record<string, unknown>;
      const before = type === 'budget:estimate_released' ? [{ type: 'budget:estimate_committed', model: v.model, estimateMicrocents: v.releasedMicrocents, cumulativeConservativeMicrocents: v.releasedMicrocents }] : [];
      for (const d of before) await append(d as RunEventDraft);
      const err = await rejection(append(ex.invalid.draft));
      expect(err, type).toBeInstanceOf(EventValidationError);
      expect(err.path, type).toBe(ex.invalid.path);
      const stored = await append(ex.valid);
      expect(stored.type).toBe(type);
      expect(stored.sequenceNumber, `${type}: the refused append consumed no sequence`).toBe(before.length + 1);
      expect(stored.timestamp).toMatch(/Z$/);
      expect(ex.stream === 'session' ? stored.sessionId : stored.runId).toBe(id);
    }
  });

  it('keeps run-only and session-only types to their own stream, and refuses unknown types', async () => {
    const world = makeWorld();
    const only = async (p: Promise<unknown>) => expect((await rejection(p)).path).toBe('event.type');
    await only(appendSessionEvent(world, 'ses_s', { type: 'cost:attempt_settled', ...Object.fromEntries(Object.entries(examples.types['cost:attempt_settled'].valid).filter(([k]) => k !== 'type')) }));
    await only(appendSessionEvent(world, 'ses_s', examples.types['agent:file_patch_proposed'].valid));
    await only(appendRunEvent(world, 'run_s', examples.types['session:turn_started'].valid));
    await only(appendRunEvent(world, 'run_s', { type: 'node:exploded', nodeId: 'n' }));
    // Dual-envelope types go on both.
    await appendRunEvent(world, 'run_s', examples.types['agent:token'].valid);
    await appendSessionEvent(world, 'ses_s', examples.types['agent:token'].valid);
  });

  it('numbers sessions densely on their own, beside runs', async () => {
    const world = makeWorld();
    for (let i = 0; i < 5; i++) {
      await appendRunEvent(world, 'run_pair', { type: 'agent:token', nodeId: 'n', token: `r${i}`, model: 'm' });
      await appendSessionEvent(world, 'ses_pair', { type: 'agent:token', nodeId: 'n', token: `s${i}`, model: 'm' });
    }
    expect((await listRunEvents(world, 'run_pair')).map((e) => e.sequenceNumber)).toEqual([1, 2, 3, 4, 5]);
    expect((await listRunEvents(world, 'ses_pair')).map((e) => e.sequenceNumber)).toEqual([1, 2, 3, 4, 5]);
  });

  it('refuses anything after a run terminal, and a second terminal for a node', async () => {
    const world = makeWorld();
    await appendRunEvent(world, 'run_t', { type: 'run:started', workflowId: UUID, inputs: {}, executionMode: 'local' });
    await appendRunEvent(world, 'run_t', { type: 'node:started', nodeId: 'n1', nodeType: 'agent' });
    await appendRunEvent(world, 'run_t', { type: 'node:skipped', nodeId: 'n2', reason: 'branch_not_taken' });
    const completed = { type: 'node:completed', nodeId: 'n1', output: 1, tokensUsed: { input: 1, output: 1 }, durationMs: 5 };
    await appendRunEvent(world, 'run_t', completed);
    const again = await rejection(appendRunEvent(world, 'run_t', completed));
    expect(again).toBeInstanceOf(EventValidationError);
    const failed = await rejection(appendRunEvent(world, 'run_t', { type: 'node:failed', nodeId: 'n2', error: { code: 'internal', message: 'x', retryable: false } }));
    expect(failed).toBeInstanceOf(EventValidationError);
    await appendRunEvent(world, 'run_t', { type: 'run:cancelled' });
    for (const late of [{ type: 'node:started', nodeId: 'n3', nodeType: 'agent' }, { type: 'run:cancelled' }]) {
      expect(await rejection(appendRunEvent(world, 'run_t', late))).toBeInstanceOf(EventValidationError);
    }
    // Not even a generic fact follows the end of the run.
    expect(await rejection(appendEvent(world, 'run_t', { type: 'my.note', payload: {} }))).toBeInstanceOf(EventValidationError);
    expect((await listRunEvents(world, 'run_t')).map((e) => e.sequenceNumber)).toEqual([1, 2, 3, 4, 5]);
    // A session ends at session:cancelled.
    await appendSessionEvent(world, 'ses_t', { type: 'session:cancelled' });
    expect(await rejection(appendSessionEvent(world, 'ses_t', { type: 'session:turn_started' }))).toBeInstanceOf(EventValidationError);
  });

  it('validates a known colon-namespaced type given to appendEvent exactly as appendRunEvent does', async () => {
    const world = makeWorld();
    const ex = examples.types['node:retrying'];
    const { type, ...fields } = ex.invalid.draft;
    const err = await rejection(appendEvent(world, 'run_ae', { type, payload: fields }));
    expect(err).toBeInstanceOf(EventValidationError);
    expect(err.path).toBe(ex.invalid.path.replace(/^event/, 'payload'));
    const { type: t2, ...good } = ex.valid;
    await appendEvent(world, 'run_ae', { type: t2, payload: good });
    // An unknown colon type is a newer writer's fact: stored as is.
    const newer = await appendEvent(world, 'run_ae', { type: 'iteration:started', payload: { iterationIndex: 1 } });
    expect(newer.sequence).toBe(2);
  });

  it('restores costs from the largest durable total and the open estimates, whatever the order of the rows', async () => {
    const world = makeWorld();
    const runId = 'run_costs';
    const drafts: RunEventDraft[] = [
      { type: 'run:started', workflowId: UUID, inputs: {}, executionMode: 'local' },
      { type: 'node:started', nodeId: 'media', nodeType: 'agent' },
      { type: 'node:started', nodeId: 'a', nodeType: 'agent' },
      // The media node ends with a 6,000 snapshot that includes its media spend (no attempt rows).
      { type: 'node:completed', nodeId: 'media', output: null, tokensUsed: { input: 0, output: 0 }, durationMs: 1, cumulativeCostMicrocents: 6000 },
      // Agent attempts: deltas 1,000 and 2,000; their cumulatives are below the media snapshot.
      { type: 'cost:attempt_settled', nodeId: 'a', model: 'gpt-5', attemptNumber: 1, inputTokens: 10, outputTokens: 1, costMicrocents: 1000, cumulativeCostMicrocents: 4000, priced: true },
      { type: 'cost:attempt_settled', nodeId: 'a', model: 'gpt-5', attemptNumber: 2, inputTokens: 10, outputTokens: 1, costMicrocents: 2000, cumulativeCostMicrocents: 8000, priced: true },
      { type: 'cost:attempt_settled', nodeId: 'a', model: 'local', attemptNumber: 3, inputTokens: 10, outputTokens: 1, costMicrocents: 0, cumulativeCostMicrocents: 8000, priced: false },
      // cost:updated is streamed-only: never a source, even when it claims more.
      { type: 'cost:updated', nodeId: 'a', model: 'gpt-5', inputTokens: 1, outputTokens: 1, costMicrocents: 99999, cumulativeCostMicrocents: 999999 },
      { type: 'budget:estimate_committed', nodeId: 'a', model: 'gpt-5', estimateMicrocents: 3000, cumulativeConservativeMicrocents: 3000 },
      { type: 'budget:estimate_committed', nodeId: 'a', model: 'claude', estimateMicrocents: 500, cumulativeConservativeMicrocents: 3500 },
    ];
    for (const d of drafts) await appendRunEvent(world, runId, d);
    const events = await loadRunEventLogForReplay(world, runId);
    // Realized = max(6000, 4000, 8000, 8000) = 8000: summing deltas (3000) or adding them to the
    // snapshot (9000) would both be wrong. Conservative = 3000 + 500.
    const want = { realizedCostMicrocents: 8000, conservativeMicrocents: 3500, conservativeByModel: { claude: 500, 'gpt-5': 3000 }, unpricedAttempts: 1 };
    expect(restoreRunCosts(events)).toEqual(want);
    let seed = 7;
    for (let k = 0; k < 50; k++) {
      const shuffled = [...events];
      for (let i = shuffled.length - 1; i > 0; i--) {
        seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
        const j = seed % (i + 1);
        [shuffled[i], shuffled[j]] = [shuffled[j], shuffled[i]];
      }
      expect(restoreRunCosts(shuffled)).toEqual(want);
    }
    expect(foldRunEvents(events).costs).toEqual(want);
  });

  // The cost restore reads a release of more than its model committed as a damaged log: accepted
  // on write, it left the run's costs unrestorable for good.
  it('refuses a release of more than is committed and not released, and a commitment past 2^53 - 1', async () => {
    const world = makeWorld();
    const runId = 'run_release';
    const commit = (model: string, n: number) => ({ nodeId: 'a', model, estimateMicrocents: n, cumulativeConservativeMicrocents: n });
    const release = (model: string, n: number) => ({ nodeId: 'a', model, releasedMicrocents: n, cumulativeConservativeMicrocents: 0 });
    await appendRunEvent(world, runId, { type: 'run:started', workflowId: UUID, inputs: {}, executionMode: 'local' });
    await appendRunEvent(world, runId, { type: 'budget:estimate_committed', ...commit('m', 50) });
    for (const [model, n] of [['other', 1], ['m', 51]] as const) {
      const err = await rejection(appendRunEvent(world, runId, { type: 'budget:estimate_released', ...release(model, n) }));
      expect(err).toBeInstanceOf(EventValidationError);
      expect(err.path).toBe('event.releasedMicrocents');
      expect(err.runId).toBe(runId);
    }
    // Exactly 50 is open for m: after 30, a release of 21 is refused, of 15 and then 5 is not.
    await appendRunEvent(world, runId, { type: 'budget:estimate_released', ...release('m', 30) });
    // appendEvent holds a known colon type to the same rule, and so does a group of appends.
    const err = await rejection(appendEvent(world, runId, { type: 'budget:estimate_released', payload: release('m', 21) }));
    expect(err.path).toBe('payload.releasedMicrocents');
    const group = await Promise.allSettled([
      appendEvent(world, runId, { type: 'budget:estimate_released', payload: release('m', 15) }),
      appendEvent(world, runId, { type: 'budget:estimate_released', payload: release('m', 15) }),
    ]);
    expect(group.map((r) => r.status)).toEqual(['fulfilled', 'rejected']);
    await appendEvent(world, runId, { type: 'budget:estimate_released', payload: release('m', 5) });
    // The conservative total stays within what a number holds exactly.
    await appendRunEvent(world, runId, { type: 'budget:estimate_committed', ...commit('big', Number.MAX_SAFE_INTEGER) });
    const past = await rejection(appendRunEvent(world, runId, { type: 'budget:estimate_committed', ...commit('m', 1) }));
    expect(past.path).toBe('event.estimateMicrocents');
    // Refused appends took no sequence, and the costs restore.
    const events = await loadRunEventLogForReplay(world, runId);
    expect(events.map((e) => e.sequenceNumber)).toEqual([1, 2, 3, 4, 5, 6]);
    expect(restoreRunCosts(events)).toMatchObject({ conservativeMicrocents: Number.MAX_SAFE_INTEGER, conservativeByModel: { m: 0 } });
  });

  // Gross sums of commitments and releases pass 2^64 after 2,049 cycles of 2^53 - 1: the checks
  // must still hold (they used to wrap, or fail for good once SQLite's integer overflowed).
  it('keeps checking estimates after many cycles of commitment and release', async () => {
    const world = makeWorld();
    const runId = 'run_cycles';
    const max = Number.MAX_SAFE_INTEGER;
    const cycle = (model: string) => [
      appendRunEvent(world, runId, { type: 'budget:estimate_committed', model, estimateMicrocents: max, cumulativeConservativeMicrocents: max }),
      appendRunEvent(world, runId, { type: 'budget:estimate_released', model, releasedMicrocents: max, cumulativeConservativeMicrocents: 0 }),
    ];
    for (let i = 0; i < 2100; i += 100) await Promise.all(Array.from({ length: 100 }, () => cycle('m')).flat());
    const over = await rejection(appendRunEvent(world, runId, { type: 'budget:estimate_released', model: 'm', releasedMicrocents: 1, cumulativeConservativeMicrocents: 0 }));
    expect(over).toBeInstanceOf(EventValidationError);
    expect(over.path).toBe('event.releasedMicrocents');
    await appendRunEvent(world, runId, { type: 'budget:estimate_committed', model: 'n', estimateMicrocents: max, cumulativeConservativeMicrocents: max });
    const past = await rejection(appendRunEvent(world, runId, { type: 'budget:estimate_committed', model: 'm', estimateMicrocents: 1, cumulativeConservativeMicrocents: max }));
    expect(past.path).toBe('event.estimateMicrocents');
    expect(restoreRunCosts(await loadRunEventLogForReplay(world, runId))).toMatchObject({ conservativeMicrocents: max });
  });

  // At the very limit: a payload nests at most 1,000 levels, which its envelope, a list of events
  // and a materialized state wrap in a few more. Reads used to stop at 128 levels, then at the
  // envelope's 1,001st, and listRuns panicked.
  it('reads, lists, verifies and folds what nests as deep as an append allows', async () => {
    const world = makeWorld();
    const nest = (levels: number, wrap: (v: unknown) => unknown) => {
      let v: unknown = 1;
      for (let i = 0; i < levels; i++) v = wrap(v);
      return v;
    };
    // The payload { workflowId, inputs: { deep } } nests 2 levels around `deep`.
    const started = (levels: number) => ({ type: 'run:started', workflowId: UUID, inputs: { deep: nest(levels, (v) => [v]) }, executionMode: 'local' }) as RunEventDraft;
    expect(await rejection(appendRunEvent(world, 'run_deep', started(999)))).toBeInstanceOf(EventValidationError);
    await appendRunEvent(world, 'run_deep', started(998));
    const want = JSON.stringify(started(998).inputs);
    for (const read of [() => listRunEvents(world, 'run_deep'), () => loadRunEventLogForReplay(world, 'run_deep')]) {
      const [e] = await read();
      expect(JSON.stringify((e as unknown as { inputs: unknown }).inputs)).toBe(want);
    }
    const events = await loadRunEventLogForReplay(world, 'run_deep');
    expect(restoreRunCosts(events).conservativeMicrocents).toBe(0);
    expect(foldRunEvents(events).status).toBe('running');

    // { stepPath, output } nests 1 level around the output.
    const output = nest(999, (v) => ({ d: v }));
    expect(await rejection(appendEvent(world, 'run_deep_state', { type: 'StepCompleted', payload: { stepPath: 's', output: { d: output } } }))).toBeInstanceOf(EventValidationError);
    await appendEvent(world, 'run_deep_state', { type: 'StepStarted', payload: { stepPath: 's' } });
    await appendEvent(world, 'run_deep_state', { type: 'StepCompleted', payload: { stepPath: 's', output } });
    const state = await materializeRunState(world, 'run_deep_state');
    // It used to come back as null past 127 levels.
    expect(JSON.stringify(state.steps.s.output)).toBe(JSON.stringify(output));
    const listed = await listEvents(world, 'run_deep_state');
    expect(JSON.stringify(materializeRunStateFromEvents('run_deep_state', listed).steps.s.output)).toBe(JSON.stringify(output));
    validateEventLogShape(listed);
    expect((await listRuns(world)).map((r) => r.runId).sort()).toEqual(['run_deep', 'run_deep_state']);
    expect((await verifyWorld(world)).ok).toBe(true);
  });

  it('folds status, nodes, pending gates and the run:paused aggregate', async () => {
    const world = makeWorld();
    const runId = 'run_fold';
    for (const d of [
      { type: 'run:started', workflowId: UUID, inputs: {}, executionMode: 'local' },
      { type: 'node:started', nodeId: 'cond', nodeType: 'condition' },
      { type: 'node:completed', nodeId: 'cond', output: null, tokensUsed: { input: 0, output: 0 }, durationMs: 1, selected: ['b'] },
      { type: 'node:skipped', nodeId: 'a', reason: 'branch_not_taken' },
      { type: 'node:started', nodeId: 'b', nodeType: 'agent' },
      { type: 'node:retrying', nodeId: 'b', attemptNumber: 1, delayMs: 10, error: { code: 'provider_rate_limit', message: '429', retryable: true } },
      { type: 'node:started', nodeId: 'b', nodeType: 'agent', attemptNumber: 2 },
      { type: 'node:started', nodeId: 'g', nodeType: 'human_gate' },
      { type: 'human_gate:paused', nodeId: 'g', gateId: 'gate_1', gateType: 'approval', message: 'Ship?' },
      { type: 'run:paused', pendingGateCount: 1, gateIds: ['gate_1'] },
    ] as RunEventDraft[]) {
      await appendRunEvent(world, runId, d);
    }
    const state = foldRunEvents(await loadRunEventLogForReplay(world, runId));
    expect(state.status).toBe('paused');
    expect(state.nodes.cond).toMatchObject({ status: 'completed', selected: ['b'] });
    expect(state.nodes.a).toMatchObject({ status: 'skipped', skipReason: 'branch_not_taken' });
    expect(state.nodes.b).toMatchObject({ status: 'running', attempts: 2 });
    expect(state.pendingGates).toEqual([{ gateId: 'gate_1', nodeId: 'g', gateType: 'approval' }]);
    expect(state.pausedAggregateMismatch ?? []).toEqual([]);
    // A run:paused naming a gate that is not open is reported, not thrown.
    const events = await loadRunEventLogForReplay(world, runId);
    const bogus = { ...events[events.length - 1], sequenceNumber: events.length + 1, gateIds: ['gate_x'] } as RunEvent;
    expect(foldRunEvents([...events, bogus]).pausedAggregateMismatch?.length).toBe(1);
  });
});

const SECRETS: Array<[string, string]> = [
  ['OpenAI key', 'sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAb7cDe0f'],
  ['Anthropic key', 'sk-ant-api03-Zy9xWv8uTs7rQp6oNm5lKj4iHg3fEd2cBa1'],
  ['AWS access key', 'AKIAIOSFODNN7EXAMPLE'],
  ['GitHub token', 'ghp_16C7e42F292c6912E7710c838347Ae178B4a'],
  ['Google API key', 'AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q'],
  ['bearer token', 'Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJl'],
  ['PEM private key', '-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7s9xQ1vPz\n-----END RSA PRIVATE KEY-----'],
  ['PGP private key', '-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBGV0c3QBCADkZ3Jv\n-----END PGP PRIVATE KEY BLOCK-----'],
  ['key after an underscore', 'OPENAI_API_KEY_sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAb7cDe0f'],
  ['Stripe secret key', 'sk_live_51HxQ2vKZp8Lm3Nw7Rt4Yb6Jc9Hd1FgAeU'],
  ['Slack token', 'xoxb-2048563921-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx'],
  ['Slack webhook', 'https://hooks.slack.com/services/T01ABCDEF/B02GHIJKL/mNoPqRsTuVwXyZ0123456789'],
];

describe('no secrets in the log', () => {
  it('refuses credentials anywhere in a run event, naming the field and never the value', async () => {
    const dataDir = tempDir();
    const world = track(localWorld({ dataDir }));
    for (const [kind, secret] of SECRETS) {
      const attempts = [
        appendRunEvent(world, 'run_sec', { type: 'run:started', workflowId: UUID, executionMode: 'local', inputs: { topic: 'x', token: secret } }),
        appendRunEvent(world, 'run_sec', { type: 'agent:tool_call', nodeId: 'n', model: 'm', toolId: 'http', toolInput: { headers: { authorization: secret } } }),
        appendEvent(world, 'run_sec', { type: 'agent:token', payload: { nodeId: 'n', token: secret, model: 'm' } }),
      ];
      // Refused in world.ts, before the core's screen: the key must not appear in the path either.
      attempts.push(appendRunEvent(world, 'run_sec', { type: 'node:completed', nodeId: 'n', output: { [secret]: { x: NaN } }, tokensUsed: { input: 1, output: 1 }, durationMs: 1 } as never));
      // An unknown type with a credential pasted into it is not echoed.
      attempts.push(appendRunEvent(world, 'run_sec', { type: `node:bogus_${secret}`, nodeId: 'n' } as never));
      // Nor is a key of a known colon type given to appendEvent.
      attempts.push(appendEvent(world, 'run_sec', { type: 'node:completed', payload: { nodeId: 'n', output: { [secret]: { x: NaN } }, tokensUsed: { input: 1, output: 1 }, durationMs: 1 } }));
      const paths = ['event.inputs.token', 'event.toolInput.headers.authorization', 'payload.token', 'event.output[<a key that looks like a credential>].x', 'event.type', 'payload.output[<a key that looks like a credential>].x'];
      for (const [i, p] of attempts.entries()) {
        const err = await rejection(p);
        expect(err, kind).toBeInstanceOf(EventValidationError);
        expect(err.path, kind).toBe(paths[i]);
        const shown = `${err.message} ${String(err)} ${err.stack} ${JSON.stringify(err.details)} ${JSON.stringify(err)}`;
        for (let k = 0; k + 6 <= secret.length; k++) {
          const piece = secret.slice(k, k + 6);
          if (/^[-\s]+$/.test(piece) || piece.includes('-----') || /BEGIN|PRIVATE|Bearer/.test(piece)) continue;
          expect(shown.includes(piece), `${kind}: the error shows "${piece}"`).toBe(false);
        }
      }
    }
    // A masked secret is exactly { secret: true, ref: 'inputs.<name>' }.
    await appendRunEvent(world, 'run_sec', { type: 'run:started', workflowId: UUID, executionMode: 'local', inputs: { apiKey: { secret: true, ref: 'inputs.apiKey' } } });
    for (const bad of [{ secret: true, ref: 'env.KEY' }, { secret: true, ref: 'inputs.apiKey', value: 'x' }, { secret: true }]) {
      const err = await rejection(appendRunEvent(world, 'run_sec2', { type: 'run:started', workflowId: UUID, executionMode: 'local', inputs: { apiKey: bad } }));
      expect(err).toBeInstanceOf(EventValidationError);
    }
    // Nor in the stream's id or the idempotency key of a run event, which are stored too.
    const secret = 'sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAb7cDe0f';
    const core = 'Ab3dEf6hIj9kLm2nOp5q';
    const node = { type: 'node:started', payload: { nodeId: 'n', nodeType: 'agent' } };
    for (const [p, path] of [
      [appendRunEvent(world, `run_${secret}`, { type: 'node:started', nodeId: 'n', nodeType: 'agent' }), 'runId'],
      [appendSessionEvent(world, `ses_${secret}`, { type: 'session:turn_started' }), 'sessionId'],
      [appendEvent(world, `run_${secret}`, node), 'runId'],
      [appendEvent(world, 'run_sec', { ...node, appendIdempotencyKey: `retry-${secret}` }), 'appendIdempotencyKey'],
    ] as const) {
      const err = await rejection(p);
      expect(err).toBeInstanceOf(EventValidationError);
      expect(err.path).toBe(path);
      expect(`${err.message} ${err.stack} ${JSON.stringify(err.details)}`.includes(core)).toBe(false);
    }
    // An idempotency conflict never shows a stored key that looks like a credential.
    const call = (text: string) => ({
      type: 'harness.model.responded',
      appendIdempotencyKey: `OPENAI_API_KEY_${secret}`,
      payload: { turn: 1, callId: 'c', model: { provider: 'openai', modelId: 'gpt-5' }, response: { text, usage: { inputTokens: 1, outputTokens: 1 } } },
    });
    await appendEvent(world, 'run_keyed', call('first'));
    const conflict = await rejection(appendEvent(world, 'run_keyed', call('second')));
    expect(conflict).toBeInstanceOf(EventAppendIdempotencyConflictError);
    expect(`${conflict.message} ${conflict.stack} ${JSON.stringify(conflict.details)}`.includes(core)).toBe(false);
    await world.close();
    // Nothing refused reached the store.
    const bytes = readdirSync(join(dataDir, 'events'))
      .map((f) => readFileSync(join(dataDir, 'events', f)).toString('latin1'))
      .join('')
      .replaceAll(`OPENAI_API_KEY_${secret}`, '');
    for (const [kind, secret] of SECRETS) expect(bytes.includes(secret.split('\n')[0].slice(-16)), kind).toBe(false);
  });
});

/**
 * Insert a row the way a newer writer would, with a correct envelope, straight into the store.
 * Only while no world of this process has the store open: this other copy of SQLite, closing,
 * takes itself for the store's last connection and removes the WAL and -shm under the world.
 */
function insertRaw(dataDir: string, runId: string, type: string, payload: Record<string, unknown>) {
  const db = asWriter(new Database(join(dataDir, 'events', 'events.db')));
  const sequence = ((db.prepare('SELECT MAX(sequence) AS s FROM events WHERE run_id = ?').get(runId) as { s: number }).s ?? 0) + 1;
  const sha = (s: string) => createHash('sha256').update(s).digest('hex');
  const eventId = `evt_${sha(canonicalize({ runId, sequence, type, payload })).slice(0, 16)}`;
  const recordedAt = new Date().toISOString();
  const envelope = canonicalize({ eventId, runId, sequence, type, recordedAt, payload });
  db.prepare('INSERT INTO events (run_id, sequence, event_id, type, recorded_at, envelope) VALUES (?, ?, ?, ?, ?, ?)').run(runId, sequence, eventId, type, recordedAt, envelope);
  db.close();
  return sequence;
}

describe('budget estimates stored before schema 3', () => {
  it('are counted when a release is checked', async () => {
    const dataDir = tempDir();
    let world = localWorld({ dataDir });
    await appendRunEvent(world, 'run_old', { type: 'run:started', workflowId: UUID, inputs: {}, executionMode: 'local' });
    for (const n of [25, 15]) {
      await appendRunEvent(world, 'run_old', { type: 'budget:estimate_committed', model: 'm', estimateMicrocents: n, cumulativeConservativeMicrocents: 40 });
    }
    await appendRunEvent(world, 'run_old', { type: 'budget:estimate_released', model: 'm', releasedMicrocents: 10, cumulativeConservativeMicrocents: 30 });
    // Gross amounts past 2^63 (net 0): an integer sum in the upgrade used to overflow, and the
    // world could not be opened at all.
    const max = Number.MAX_SAFE_INTEGER;
    for (let i = 0; i < 1100; i++) {
      await appendRunEvent(world, 'run_gross', { type: 'budget:estimate_committed', model: 'big', estimateMicrocents: max, cumulativeConservativeMicrocents: max });
      await appendRunEvent(world, 'run_gross', { type: 'budget:estimate_released', model: 'big', releasedMicrocents: max, cumulativeConservativeMicrocents: 0 });
    }
    // Gross sums past 2^53, where floating point is inexact: the open amount must be exact.
    for (const [model, last] of [['exact', max], ['exact2', max - 2]] as const) {
      for (const [kind, n] of [['committed', max], ['released', max], ['committed', max], ['released', max], ['committed', last]] as const) {
        const draft = kind === 'committed'
          ? { type: 'budget:estimate_committed', model, estimateMicrocents: n, cumulativeConservativeMicrocents: n }
          : { type: 'budget:estimate_released', model, releasedMicrocents: n, cumulativeConservativeMicrocents: 0 };
        await appendRunEvent(world, `run_${model}`, draft);
      }
    }
    await world.close();
    downgradeToSchema2(dataDir);
    world = track(localWorld({ dataDir }));
    const release = (n: number) => appendRunEvent(world, 'run_old', { type: 'budget:estimate_released', model: 'm', releasedMicrocents: n, cumulativeConservativeMicrocents: Math.max(0, 30 - n) });
    // What is open is exactly what may be released: one micro-cent more is refused.
    const refused = (err: WorldError) => {
      expect(err).toBeInstanceOf(EventValidationError);
      expect(err.path).toBe('event.releasedMicrocents');
    };
    refused(await rejection(release(31)));
    await release(30);
    refused(await rejection(appendRunEvent(world, 'run_gross', { type: 'budget:estimate_released', model: 'big', releasedMicrocents: 1, cumulativeConservativeMicrocents: 0 })));
    const releaseOf = (model: string, n: number) => appendRunEvent(world, `run_${model}`, { type: 'budget:estimate_released', model, releasedMicrocents: n, cumulativeConservativeMicrocents: 0 });
    refused(await rejection(releaseOf('exact2', max - 1)));
    await releaseOf('exact', max);
    await releaseOf('exact2', max - 2);
    expect(schemaVersion(dataDir)).toBe(SCHEMA_VERSION);
  });

  // A process of the version before kept the world open while a newer one upgraded it. It kept
  // appending, without keeping the estimates it does not know: a release it had checked then
  // was refused, or one it let through was accepted twice and the run's costs became unreadable.
  it('are not left behind by a process of an earlier version that had the world open', async () => {
    const dataDir = tempDir();
    let world = localWorld({ dataDir });
    await appendRunEvent(world, 'run_old', { type: 'run:started', workflowId: UUID, inputs: {}, executionMode: 'local' });
    await world.close();
    downgradeToSchema2(dataDir);
    // The earlier version's writer, open before the upgrade, with its insert prepared.
    const old = new Database(join(dataDir, 'events', 'events.db'));
    const insert = old.prepare('INSERT INTO events (run_id, sequence, event_id, type, recorded_at, envelope) VALUES (?, ?, ?, ?, ?, ?)');
    const row = (sequence: number) => ['run_old', sequence, `evt_${'0'.repeat(15)}${sequence}`, 'budget:estimate_committed', '2026-11-30T00:00:00.000Z', '{}'];
    world = track(localWorld({ dataDir }));
    await appendRunEvent(world, 'run_old', { type: 'budget:estimate_committed', model: 'm', estimateMicrocents: 5, cumulativeConservativeMicrocents: 5 });
    // SQLite's own error, which carries no code of ours: its message names the writer check.
    expect(() => insert.run(...row(3))).toThrow(/no such function: little_world_writer/);
    // Closed after the world: a second SQLite in this process closing last would delete the WAL.
    await world.close();
    old.close();
    world = track(localWorld({ dataDir }));
    expect((await listEvents(world, 'run_old')).map((e) => e.sequence)).toEqual([1, 2]);
    // Still open for this version, with the estimate it recorded.
    const err = await rejection(appendRunEvent(world, 'run_old', { type: 'budget:estimate_released', model: 'm', releasedMicrocents: 6, cumulativeConservativeMicrocents: 0 }));
    expect(err).toBeInstanceOf(EventValidationError);
    expect(err.path).toBe('event.releasedMicrocents');
    await appendRunEvent(world, 'run_old', { type: 'budget:estimate_released', model: 'm', releasedMicrocents: 5, cumulativeConservativeMicrocents: 0 });
  });
});

describe('restoring costs from a list the caller gives', () => {
  const base = { runId: 'run_list', timestamp: '2026-11-30T00:00:00.000Z' };
  const commit = { ...base, type: 'budget:estimate_committed', sequenceNumber: 2, model: 'm', estimateMicrocents: 100, cumulativeConservativeMicrocents: 100 };
  const release = { ...base, type: 'budget:estimate_released', sequenceNumber: 3, model: 'm', releasedMicrocents: 100, cumulativeConservativeMicrocents: 0 };

  // A release counted twice handed money back to the cap as headroom; a commit counted twice doubled it.
  it('refuses a row given twice, as the fold does', () => {
    expect(restoreRunCosts([commit, release] as RunEvent[]).conservativeMicrocents).toBe(0);
    for (const list of [[commit, commit], [commit, release, release]]) {
      for (const f of [restoreRunCosts, foldRunEvents]) {
        let err: unknown;
        try {
          f(list as RunEvent[]);
        } catch (e) {
          err = e;
        }
        expect(err, f.name).toBeInstanceOf(EventLogCorruptError);
        // The row given again is named.
        expect((err as WorldError).sequence, f.name).toBe(list[list.length - 1].sequenceNumber);
      }
    }
  });

  it('never shows a credential from the list: not a key, not a run id', () => {
    const secret = `sk-ant-api03-${'Xy7Q'.repeat(10)}`;
    const cases: unknown[][] = [
      [{ ...commit, extra: { [secret]: Number.NaN } }],
      [commit, { ...release, runId: `run_${secret}` }],
      [{ ...commit, runId: `run_${secret}` }, { ...release, runId: `run_${secret}` }, { ...release, runId: `run_${secret}` }],
      [{ ...commit, runId: secret }, { ...commit, runId: secret }],
    ];
    for (const list of cases) {
      for (const f of [restoreRunCosts, foldRunEvents]) {
        let err: WorldError | undefined;
        try {
          f(list as RunEvent[]);
        } catch (e) {
          err = e as WorldError;
        }
        expect(err, f.name).toBeInstanceOf(WorldError);
        const seen = `${err?.message} ${JSON.stringify(err?.details)} ${err?.stack} ${JSON.stringify(err)}`;
        expect(seen.includes('Xy7QXy7Q'), seen).toBe(false);
      }
    }
    // Such an id is still a run id (appends take it): its events restore and fold.
    const list = [{ ...commit, runId: `run_${secret}` }, { ...release, runId: `run_${secret}` }] as RunEvent[];
    expect(restoreRunCosts(list).conservativeMicrocents).toBe(0);
    expect(foldRunEvents(list).costs.conservativeMicrocents).toBe(0);
  });
});

describe('reading run-event logs written by a newer writer', () => {
  it('drops unknown types on the display read, refuses them on the replay read, and throws on a broken known body', async () => {
    const dataDir = tempDir();
    let world = localWorld({ dataDir });
    await appendRunEvent(world, 'run_newer', { type: 'run:started', workflowId: UUID, inputs: {}, executionMode: 'local' });
    await appendRunEvent(world, 'run_newer', { type: 'node:started', nodeId: 'n1', nodeType: 'agent' });
    await world.close();
    const s3 = insertRaw(dataDir, 'run_newer', 'iteration:started', { nodeId: 'n1', iterationIndex: 0 });
    const s4 = insertRaw(dataDir, 'run_newer', 'cost:attempt_settled_v2', { nodeId: 'n1' });
    world = track(localWorld({ dataDir }));
    await appendRunEvent(world, 'run_newer', { type: 'agent:token', nodeId: 'n1', token: 'x', model: 'm' });

    const shown = await listRunEvents(world, 'run_newer');
    expect(shown.map((e) => [e.sequenceNumber, e.type])).toEqual([[1, 'run:started'], [2, 'node:started'], [5, 'agent:token']]);
    const refused = await rejection(loadRunEventLogForReplay(world, 'run_newer'));
    expect(refused).toBeInstanceOf(ReplayRefusedError);
    expect(refused.code).toBe('REPLAY_REFUSED');
    expect(refused.runId).toBe('run_newer');
    expect(refused.details.sequences).toEqual([s3, s4]);
    // No field says what to do about it: the message says a newer @little-workflow/world reads them.
    expect(refused.message).toContain('needs a newer @little-workflow/world');
    // Events of the event log's own types under a run id that also holds run events: the message
    // says to give the two kinds different run ids, not to upgrade.
    await appendEvent(world, 'run_mixed', { type: 'RunStarted', payload: {} });
    await appendRunEvent(world, 'run_mixed', { type: 'node:started', nodeId: 'n1', nodeType: 'agent' });
    const mixed = await rejection(loadRunEventLogForReplay(world, 'run_mixed'));
    expect(mixed).toBeInstanceOf(ReplayRefusedError);
    expect(mixed.details.sequences).toEqual([1]);
    expect(mixed.message).toContain('different run ids');
    expect(mixed.message).not.toContain('newer');
    // A generic fact whose type holds a credential is refused for replay without showing it.
    const secret = `sk-ant-api03-${'Xy7Q'.repeat(10)}`;
    await appendEvent(world, 'run_typed', { type: `node:${secret}`, payload: {} });
    const hidden = await rejection(loadRunEventLogForReplay(world, 'run_typed'));
    expect(hidden).toBeInstanceOf(ReplayRefusedError);
    expect(hidden.details.sequences).toEqual([1]);
    expect(`${hidden.message} ${JSON.stringify(hidden.details)}`.includes('Xy7Q')).toBe(false);
    // Every row is still there for the generic reader.
    expect((await listEvents(world, 'run_newer')).length).toBe(5);

    // Refinements added later hold on write only: rows an earlier version stored stay readable.
    // (Rows are inserted with another copy of SQLite, which may not share the store with an open
    // world in this process: see `insertRaw`.)
    await world.close();
    const refined = [
      insertRaw(dataDir, 'run_earlier', 'budget:warning', { spentMicrocents: 10, limitMicrocents: 100, thresholdPct: 80 }),
      insertRaw(dataDir, 'run_earlier', 'cost:attempt_settled', { nodeId: 'n', model: 'm', attemptNumber: 1, inputTokens: 1, outputTokens: 1, costMicrocents: 100, cumulativeCostMicrocents: 50, priced: true }),
    ];
    world = track(localWorld({ dataDir }));
    expect((await listRunEvents(world, 'run_earlier')).map((e) => e.sequenceNumber)).toEqual(refined);
    expect(foldRunEvents(await loadRunEventLogForReplay(world, 'run_earlier')).costs.realizedCostMicrocents).toBe(50);
    for (const draft of [
      { type: 'budget:warning', spentMicrocents: 10, limitMicrocents: 100, thresholdPct: 80 },
      { type: 'cost:attempt_settled', nodeId: 'n', model: 'm', attemptNumber: 1, inputTokens: 1, outputTokens: 1, costMicrocents: 100, cumulativeCostMicrocents: 50, priced: true },
    ]) {
      expect(await rejection(appendRunEvent(world, 'run_earlier', draft))).toBeInstanceOf(EventValidationError);
    }

    // A known type whose body does not parse is corruption, on both reads.
    await world.close();
    insertRaw(dataDir, 'run_broken', 'node:started', { nodeType: 'agent' });
    world = track(localWorld({ dataDir }));
    // One read at a time: a second read made up front could reject before anyone awaits it.
    for (const read of [() => listRunEvents(world, 'run_broken'), () => loadRunEventLogForReplay(world, 'run_broken')]) {
      const err = await rejection(read());
      expect(err).toBeInstanceOf(EventLogCorruptError);
      expect(err.sequence).toBe(1);
    }
  });

  it('shows run-event logs through the little command', async () => {
    const dataDir = tempDir();
    const world = localWorld({ dataDir });
    await appendRunEvent(world, 'run_cli_re', { type: 'run:started', workflowId: UUID, inputs: {}, executionMode: 'local' });
    await appendRunEvent(world, 'run_cli_re', { type: 'node:started', nodeId: 'n1', nodeType: 'agent' });
    await appendRunEvent(world, 'run_cli_re', { type: 'cost:attempt_settled', nodeId: 'n1', model: 'gpt-5', attemptNumber: 1, inputTokens: 1, outputTokens: 1, costMicrocents: 700, cumulativeCostMicrocents: 700, priced: true });
    await appendSessionEvent(world, 'ses_cli_re', { type: 'session:turn_started' });
    await world.close();
    const little = (...args: string[]) => spawnSync(process.execPath, [join(packageRoot, 'bin', 'little.js'), ...args, '--data-dir', dataDir], { encoding: 'utf8' });
    const events = little('events', 'run_cli_re');
    expect(events.status).toBe(0);
    expect(events.stdout.trim().split('\n').map((l) => JSON.parse(l).type)).toEqual(['run:started', 'node:started', 'cost:attempt_settled']);
    const replay = little('replay', 'run_cli_re');
    expect(replay.status, replay.stderr).toBe(0);
    const state = JSON.parse(replay.stdout);
    expect(state.vocabulary).toBe('run-events');
    expect(state.status).toBe('running');
    expect(state.costs.realizedCostMicrocents).toBe(700);
    expect(JSON.parse(little('replay', 'ses_cli_re').stdout).status).toBe('open');
    expect(little('verify').status).toBe(0);
    insertRaw(dataDir, 'run_cli_re', 'node:completed', { nodeId: 7 });
    const verify = little('verify', 'run_cli_re');
    expect(verify.status).toBe(1);
    expect(JSON.parse(verify.stdout).problems.map((p: { kind: string }) => p.kind)).toContain('run-event-body');
  });
});
