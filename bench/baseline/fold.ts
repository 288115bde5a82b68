/**
 * The materializer written in plain TypeScript, as the pure-TypeScript world would have it.
 *
 * Two uses: the benchmark measures the native fold against `listEvents` plus this fold, and the
 * test suite checks that both folds give the same state for random runs (a second, independent
 * implementation of the contract's materialization rules). Money is summed exactly, as BigInt femto-dollars.
 */

export type Registry = {
  asOf?: string;
  models: Array<{ provider: string; modelId: string; inputPerMTok: number; outputPerMTok: number; cacheReadPerMTok?: number; effectiveFrom?: string }>;
};

type Envelope = { runId: string; sequence: number; type: string; recordedAt: string; payload: Record<string, any> };

type Rates = { input: bigint; output: bigint; cacheRead?: bigint };

/** A model's entries: each in effect from `from` (ms since the epoch; -Infinity: always). */
type Dated = Array<{ from: number; rates: Rates }>;

/** A USD-per-million-tokens rate as whole nano-dollars (= femto-dollars per token). */
function nano(usd: number): bigint {
  const [mantissa, exp = '0'] = String(usd).split('e');
  const [int, frac = ''] = mantissa.split('.');
  const shift = 9 - (frac.length - Number(exp));
  if (shift < 0) throw new Error(`rate ${usd} has more than 9 decimals`);
  return BigInt(int + frac) * 10n ** BigInt(shift);
}

export function pricingTable(base: Registry, over?: Registry): { asOf?: string; rates: Map<string, Dated> } {
  const rates = new Map<string, Dated>();
  for (const reg of over ? [base, over] : [base]) {
    // A model the override prices takes none of the base's entries.
    const mine = new Map<string, Dated>();
    for (const m of reg.models) {
      const key = `${m.provider.toLowerCase()}\u0000${m.modelId}`;
      if (!mine.has(key)) mine.set(key, []);
      mine.get(key)!.push({
        from: m.effectiveFrom === undefined ? -Infinity : Date.parse(m.effectiveFrom),
        rates: {
          input: nano(m.inputPerMTok),
          output: nano(m.outputPerMTok),
          cacheRead: m.cacheReadPerMTok === undefined ? undefined : nano(m.cacheReadPerMTok),
        },
      });
    }
    for (const [key, entries] of mine) rates.set(key, entries);
  }
  return { asOf: over?.asOf ?? base.asOf, rates };
}

/** The entry of a model in effect at `at` (the latest that started by then). */
function ratesAt(entries: Dated | undefined, at: string): Rates | undefined {
  const t = Date.parse(at);
  let best: { from: number; rates: Rates } | undefined;
  for (const e of entries ?? []) if (e.from <= t && (best === undefined || e.from > best.from)) best = e;
  return best?.rates;
}

type Usage = { input: number; output: number; cached: number; reasoning: number; cost: bigint; priced: number; unpriced: number };
const newUsage = (): Usage => ({ input: 0, output: 0, cached: 0, reasoning: 0, cost: 0n, priced: 0, unpriced: 0 });

function usd(femto: bigint): number {
  const s = femto.toString().padStart(16, '0');
  return Number(`${s.slice(0, -15)}.${s.slice(-15)}`);
}

function usageJson(u: Usage) {
  return {
    inputTokens: u.input,
    outputTokens: u.output,
    cachedInputTokens: u.cached,
    reasoningTokens: u.reasoning,
    costUsd: u.priced === 0 && u.unpriced > 0 ? null : usd(u.cost),
    pricedCalls: u.priced,
    unpricedCalls: u.unpriced,
  };
}

function addCall(u: Usage, t: { input: number; output: number; cached: number; reasoning: number }, cost: bigint | null) {
  u.input += t.input;
  u.output += t.output;
  u.cached += t.cached;
  u.reasoning += t.reasoning;
  if (cost === null) u.unpriced++;
  else {
    u.cost += cost;
    u.priced++;
  }
}

type Step = {
  kind?: string; status: string; attempts: number; startedAt?: string; finishedAt?: string;
  output?: unknown; hasOutput: boolean; outputRef?: string; error?: unknown; groupId?: string; usage: Usage;
};

/**
 * Fold a run's events into its state. `sha256` hashes a canonical manifest for the drift check and
 * `canonical` writes RFC 8785 JSON (both injected, so this file needs no dependency).
 */
export function foldRun(
  runId: string,
  events: readonly Envelope[],
  pricing: { asOf?: string; rates: Map<string, Dated> },
  canonical: (v: unknown) => string,
  sha256: (s: string) => string,
): Record<string, unknown> {
  let status = 'pending';
  let workflowVersionId: string | undefined;
  let startedAt: string | undefined;
  let finishedAt: string | undefined;
  let output: unknown;
  let hasOutput = false;
  let outputRef: string | undefined;
  let error: unknown;
  let hasError = false;
  let outerLoop: unknown;
  let lastRecordedAt: string | undefined;
  const usage = newUsage();
  const byModel = new Map<string, Usage>();
  const steps = new Map<string, Step>();
  const artifacts: string[] = [];
  const seen = new Set<string>();
  const sessions: Array<{ sequence: number; role: string; runId: string; manifestHash: string; status: string }> = [];
  const drift: unknown[] = [];
  const refRe = /^artifact:\/\/art_[0-9a-f]{16}$/;

  const collect = (v: unknown): void => {
    if (typeof v === 'string') {
      if (refRe.test(v) && !seen.has(v)) {
        seen.add(v);
        artifacts.push(v);
      }
    } else if (Array.isArray(v)) v.forEach(collect);
    else if (v && typeof v === 'object') {
      // canonical key order, as the native fold scans canonical text
      for (const k of Object.keys(v).sort()) collect((v as Record<string, unknown>)[k]);
    }
  };
  const touch = (at: string) => {
    if (status === 'pending') {
      status = 'running';
      startedAt ??= at;
    }
  };
  const step = (path: string): Step => {
    let s = steps.get(path);
    if (!s) {
      s = { status: 'pending', attempts: 0, hasOutput: false, usage: newUsage() };
      steps.set(path, s);
    }
    return s;
  };

  events.forEach((e, i) => {
    if (e.runId !== runId || e.sequence !== i + 1) throw new Error(`log of ${runId} is not dense at ${i + 1}`);
    const p = e.payload;
    const at = e.recordedAt;
    collect(p);
    switch (e.type) {
      case 'RunStarted':
        status = 'running';
        startedAt ??= at;
        finishedAt = undefined;
        hasError = false;
        if (typeof p.workflowVersionId === 'string') workflowVersionId = p.workflowVersionId;
        break;
      case 'RunCompleted':
        status = 'completed';
        finishedAt = at;
        hasOutput = 'output' in p;
        output = p.output;
        outputRef = p.outputRef;
        hasError = false;
        break;
      case 'RunFailed':
        status = 'failed';
        finishedAt = at;
        hasError = 'error' in p;
        error = p.error;
        break;
      case 'OuterLoopCycleCompleted': {
        const kind = p.supervise?.kind ?? '';
        if (kind === 'done') {
          status = 'completed';
          finishedAt = at;
          if (p.supervise && 'finalOutput' in p.supervise) {
            hasOutput = true;
            output = p.supervise.finalOutput;
          }
        } else touch(at);
        outerLoop = { outerLoopId: p.outerLoopId ?? '', cycleNumber: p.cycleNumber ?? 0, lastKind: kind };
        break;
      }
      case 'harness.session.started': {
        const role = p.role ?? '';
        const hash = p.manifestHash ?? '';
        if (p.manifest !== undefined) {
          const expected = `sha256:${sha256(canonical(p.manifest))}`;
          if (expected !== hash) drift.push({ sequence: e.sequence, role, reason: 'hash-mismatch', manifestHash: hash, expected });
        }
        const prev = [...sessions].reverse().find((s) => s.role === role);
        if (prev && prev.manifestHash !== hash) drift.push({ sequence: e.sequence, role, reason: 'changed', manifestHash: hash, expected: prev.manifestHash });
        sessions.push({ sequence: e.sequence, role, runId: p.runId ?? '', manifestHash: hash, status: 'running' });
        break;
      }
      case 'harness.session.completed':
      case 'harness.session.failed': {
        const s = [...sessions].reverse().find((x) => x.runId === (p.runId ?? '') && x.status === 'running');
        if (s) s.status = e.type.endsWith('completed') ? 'completed' : 'failed';
        break; // the rollup's usage is never added
      }
      case 'harness.model.responded': {
        const u = p.response.usage;
        const t = { input: u.inputTokens, output: u.outputTokens, cached: u.cachedInputTokens ?? 0, reasoning: u.reasoningTokens ?? 0 };
        const r = ratesAt(pricing.rates.get(`${String(p.model.provider).toLowerCase()}\u0000${p.model.modelId}`), e.recordedAt);
        const cached = BigInt(Math.min(t.cached, t.input));
        const cost = r ? (BigInt(t.input) - cached) * r.input + cached * (r.cacheRead ?? r.input) + BigInt(t.output) * r.output : null;
        addCall(usage, t, cost);
        const key = `${p.model.provider.replaceAll('%', '%25').replaceAll('/', '%2F')}/${p.model.modelId}`;
        if (!byModel.has(key)) byModel.set(key, newUsage());
        addCall(byModel.get(key)!, t, cost);
        if (typeof p.stepPath === 'string') {
          const s = step(p.stepPath);
          if (s.status === 'pending') s.status = 'running';
          addCall(s.usage, t, cost);
        }
        break;
      }
      default: {
        if (typeof p.stepPath !== 'string') break;
        const folded = /^(Step(Started|Completed|Failed)|ParallelGroup(Started|Completed|Failed)|ParallelBranch(Scheduled|Completed|Failed))$/;
        if (!folded.test(e.type)) break;
        touch(at);
        const s = step(p.stepPath);
        if (e.type.startsWith('ParallelGroup')) s.kind = 'parallel.group';
        else if (e.type.startsWith('ParallelBranch')) s.kind = 'parallel.branch';
        else if (typeof p.stepKind === 'string') s.kind = p.stepKind;
        if (typeof p.groupId === 'string') s.groupId = p.groupId;
        if (/Started$|Scheduled$/.test(e.type)) {
          s.status = 'running';
          s.attempts++;
          s.startedAt ??= at;
          s.finishedAt = undefined;
          s.error = undefined;
        } else if (/Completed$/.test(e.type)) {
          s.status = 'completed';
          s.finishedAt = at;
          s.error = undefined;
          s.hasOutput = 'output' in p;
          s.output = p.output;
          s.outputRef = p.outputRef;
        } else {
          s.status = 'failed';
          s.finishedAt = at;
          s.error = p.error;
        }
      }
    }
    if (e.type !== undefined) lastRecordedAt = at;
  });

  const state: Record<string, unknown> = {
    runId,
    status,
    eventCount: events.length,
    usage: usageJson(usage),
    usageByModel: Object.fromEntries([...byModel].map(([k, u]) => [k, usageJson(u)])),
    artifacts,
    steps: Object.fromEntries(
      [...steps].map(([path, s]) => {
        const o: Record<string, unknown> = { stepPath: path, status: s.status, attempts: s.attempts, usage: usageJson(s.usage) };
        if (s.kind !== undefined) o.stepKind = s.kind;
        if (s.groupId !== undefined) o.groupId = s.groupId;
        if (s.startedAt !== undefined) o.startedAt = s.startedAt;
        if (s.finishedAt !== undefined) o.finishedAt = s.finishedAt;
        if (s.hasOutput && s.output !== undefined) o.output = s.output;
        if (s.outputRef !== undefined) o.outputRef = s.outputRef;
        if (s.error !== undefined) o.error = s.error;
        return [path, o];
      }),
    ),
    sessions,
    manifestDrift: drift,
  };
  if (workflowVersionId !== undefined) state.workflowVersionId = workflowVersionId;
  if (startedAt !== undefined) state.startedAt = startedAt;
  if (finishedAt !== undefined) state.finishedAt = finishedAt;
  if (lastRecordedAt !== undefined) state.lastRecordedAt = lastRecordedAt;
  if (hasOutput && output !== undefined) state.output = output;
  if (outputRef !== undefined) state.outputRef = outputRef;
  if (hasError && error !== undefined) state.error = error;
  if (outerLoop !== undefined) state.outerLoop = outerLoop;
  if (pricing.asOf !== undefined) state.pricingAsOf = pricing.asOf;
  return state;
}
