// Two independent folds must agree: the native materializer and the plain-TypeScript fold in
// bench/baseline/fold.ts, on random runs that use every rule.
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { bundledPricing, canonicalize, materializeRunStateFromEvents, type EventEnvelope, type PricingRegistry } from '@little-workflow/world';
import { foldRun, pricingTable } from '../bench/baseline/fold';

function rng(seed: number) {
  return () => {
    seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
    return seed / 2 ** 32;
  };
}

const sha256 = (s: string) => createHash('sha256').update(s).digest('hex');

function randomRun(runId: string, next: () => number): EventEnvelope[] {
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(next() * xs.length)];
  const int = (n: number) => Math.floor(next() * n);
  const steps = ['a', 'b', 'fan/x', 'fan/y', 'deep/one/two'];
  const models = [['openai', 'gpt-5'], ['OpenAI', 'gpt-5-mini'], ['anthropic', 'claude-sonnet-4-5'], ['acme', 'm1'], ['acme', 'late'], ['nobody', 'unpriced'], ['google', 'gemini-2.5-pro'], ['google', 'gemini-4-carbon']];
  const refs = ['artifact://art_00000000000000aa', 'artifact://art_0123456789abcdef', 'not artifact://art_00000000000000aa'];
  const manifests = [{ a: 1 }, { a: 2 }, { b: [1, 'x'] }];
  const values = [null, 1, 'text', { nested: { v: [1, 2] } }, [], refs[0]];
  const events: Omit<EventEnvelope, 'eventId' | 'sequence' | 'runId'>[] = [];
  const n = 1 + int(60);
  for (let i = 0; i < n; i++) {
    // Days on both sides of the dated registry entries (the bundled 2026-12-01, the override's).
    const at = `2026-${pick(['11-30', '12-01', '12-02', '12-03'])}T${String(int(24)).padStart(2, '0')}:${String(int(60)).padStart(2, '0')}:00.000Z`;
    const kind = int(16);
    const stepPath = pick(steps);
    let type: string;
    let payload: Record<string, unknown>;
    switch (kind) {
      case 0: type = 'RunStarted'; payload = next() < 0.5 ? { workflowVersionId: `wv_${int(3)}` } : {}; break;
      case 1: type = 'RunCompleted'; payload = next() < 0.5 ? { output: pick(values) } : { outputRef: pick(refs.slice(0, 2)) }; break;
      case 2: type = 'RunFailed'; payload = { error: { message: 'x', code: int(3) } }; break;
      case 3: type = 'StepStarted'; payload = { stepPath, ...(next() < 0.5 ? { stepKind: 'ai.generate' } : {}), attempt: 1 + int(3) }; break;
      case 4: type = 'StepCompleted'; payload = next() < 0.7 ? { stepPath, output: pick(values) } : { stepPath }; break;
      case 5: type = 'StepFailed'; payload = { stepPath, error: { message: 'boom' } }; break;
      case 6: type = pick(['ParallelGroupStarted', 'ParallelGroupCompleted', 'ParallelGroupFailed']); payload = { stepPath: 'fan', groupId: 'g' }; break;
      case 7: type = pick(['ParallelBranchScheduled', 'ParallelBranchCompleted', 'ParallelBranchFailed']); payload = { stepPath: pick(['fan/x', 'fan/y']), groupId: 'g', branch: int(2), output: pick(values) }; break;
      case 8: type = 'OuterLoopCycleCompleted'; payload = { outerLoopId: 'ol_1', cycleNumber: 1 + int(4), supervise: next() < 0.5 ? { kind: 'done', finalOutput: pick(values) } : { kind: 'continue' } }; break;
      case 9: {
        const manifest = pick(manifests);
        type = 'harness.session.started';
        payload = { runId: pick([runId, 'run_sub']), role: pick(['planner', 'fixer']), task: { kind: 'plan' }, manifest, manifestHash: next() < 0.8 ? `sha256:${sha256(canonicalize(manifest))}` : 'sha256:bad' };
        break;
      }
      case 10: type = pick(['harness.session.completed', 'harness.session.failed']); payload = { runId: pick([runId, 'run_sub']), usage: { inputTokens: 999, outputTokens: 999, cachedInputTokens: 0, reasoningTokens: 0 }, error: { message: 'e' } }; break;
      case 11: type = 'my.unknown.fact'; payload = { data: pick(values), list: [pick(refs)] }; break;
      default: {
        const [provider, modelId] = pick(models);
        const input = int(200_000);
        const output = int(20_000);
        type = 'harness.model.responded';
        payload = {
          turn: 1, callId: `c${i}`, model: { provider, modelId },
          ...(next() < 0.7 ? { stepPath } : {}),
          response: { usage: { inputTokens: input, outputTokens: output, ...(next() < 0.5 ? { cachedInputTokens: int(input + 1) } : {}), ...(next() < 0.5 ? { reasoningTokens: int(output + 1) } : {}) } },
        };
      }
    }
    events.push({ type, payload, recordedAt: at });
  }
  return events.map((e, i) => ({ ...e, eventId: 'evt_0000000000000000', runId, sequence: i + 1 }));
}

describe('the native fold and an independent TypeScript fold agree', () => {
  it('on 300 random runs', () => {
    const over: PricingRegistry = {
      asOf: 'oracle',
      models: [
        { provider: 'acme', modelId: 'm1', inputPerMTok: 0.000001, outputPerMTok: 123.456789 },
        { provider: 'acme', modelId: 'm1', inputPerMTok: 2, outputPerMTok: 3, effectiveFrom: '2026-12-02T12:00:00+02:00' },
        // Unpriced before its first entry.
        { provider: 'acme', modelId: 'late', inputPerMTok: 1, outputPerMTok: 1, cacheReadPerMTok: 0.5, effectiveFrom: '2026-12-01' },
      ],
    };
    const table = pricingTable(bundledPricing(), over);
    const next = rng(2026);
    for (let r = 0; r < 300; r++) {
      const runId = `run_oracle_${r}`;
      const events = randomRun(runId, next);
      const native = materializeRunStateFromEvents(runId, events, { pricing: over });
      const ts = foldRun(runId, events as never, table, canonicalize, sha256);
      expect(canonicalize(native), `run ${r}`).toBe(canonicalize(ts));
    }
  });
});
