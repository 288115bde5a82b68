// Materialization: a run's state folded from its events, priced.
import { call, callSync, checkRunIdType, invalid } from './errors.js';
import type { EventEnvelope } from './envelopes.js';
import { frozen, jsonOf, options, snapshotOf } from './json.js';
import { native } from './native.js';
import { pricingText, type PricingRegistry } from './pricing.js';
import { nativeOf, type World } from './worlds.js';

/** Tokens and priced dollars of a scope. */
export type UsageTotals = {
  readonly inputTokens: number;
  /** Subset of inputTokens. */
  readonly cachedInputTokens: number;
  readonly outputTokens: number;
  /** Subset of outputTokens. */
  readonly reasoningTokens: number;
  /** `null` = unpriced, NOT free: every call in scope was unpriced. `0` only when there were no calls. */
  readonly costUsd: number | null;
  readonly pricedCalls: number;
  readonly unpricedCalls: number;
};

/** One step of a run (or a parallel group or branch). */
export type MaterializedStepState = {
  readonly stepPath: string;
  readonly status: 'pending' | 'running' | 'completed' | 'failed';
  /** `stepKind` of its StepStarted, or `parallel.group` / `parallel.branch`. */
  readonly stepKind?: string;
  readonly groupId?: string;
  /** How many times it started (a retry is a second attempt). */
  readonly attempts: number;
  readonly startedAt?: string;
  readonly finishedAt?: string;
  readonly output?: unknown;
  readonly outputRef?: string;
  readonly error?: unknown;
  /** Model calls attributed to this step by `stepPath`. */
  readonly usage: UsageTotals;
};

/** A harness session seen in the run. */
export type MaterializedSession = {
  readonly sequence: number;
  readonly role: string;
  readonly runId: string;
  readonly manifestHash: string;
  readonly status: 'running' | 'completed' | 'failed';
};

/** A session whose manifest drifted. */
export type ManifestDrift = {
  readonly sequence: number;
  readonly role: string;
  /** `changed`: an earlier session of the role had another hash; `hash-mismatch`: the hash is not sha256 of the canonical manifest. */
  readonly reason: 'changed' | 'hash-mismatch';
  readonly manifestHash: string;
  readonly expected: string;
};

/** A run's state, folded from its events. */
export type MaterializedRunState = {
  readonly runId: string;
  readonly workflowVersionId?: string;
  readonly status: 'pending' | 'running' | 'completed' | 'failed';
  readonly startedAt?: string;
  readonly finishedAt?: string;
  readonly lastRecordedAt?: string;
  readonly output?: unknown;
  readonly outputRef?: string;
  /** Run-wide tokens and priced dollars. */
  readonly usage: UsageTotals;
  /**
   * The same, per `provider/modelId`. The provider's own `%` and `/` are written `%25` and `%2F`,
   * so the first `/` ends it and no two models share a key.
   */
  readonly usageByModel: Readonly<Record<string, UsageTotals>>;
  readonly steps: Readonly<Record<string, MaterializedStepState>>;
  /** Every artifact reference in the run's payloads, in order of first appearance. */
  readonly artifacts: readonly string[];
  readonly sessions: readonly MaterializedSession[];
  readonly manifestDrift: readonly ManifestDrift[];
  readonly outerLoop?: { readonly outerLoopId: string; readonly cycleNumber: number; readonly lastKind: string };
  readonly error?: unknown;
  readonly eventCount: number;
  /** `asOf` of the registry that priced the run. */
  readonly pricingAsOf?: string;
};

/** Fold a run's stored events into its state, inside the native core. Deep-frozen. */
export async function materializeRunState(world: World, runId: string): Promise<MaterializedRunState> {
  const handle = nativeOf(world);
  checkRunIdType(runId);
  const text = await call(() => handle.materialize(runId));
  return frozen<MaterializedRunState>(text);
}

/**
 * Fold events into a run's state: a pure function, the same events always give the same state.
 * Calls are priced with the bundled registry, and `options.pricing` merged over it.
 */
export function materializeRunStateFromEvents(
  runId: string,
  events: readonly EventEnvelope[],
  opts?: { pricing?: PricingRegistry },
): MaterializedRunState {
  checkRunIdType(runId);
  const copy = snapshotOf(events, 'events', { runId, around: 2 });
  if (!Array.isArray(copy)) invalid('events', 'must be an array of envelopes', runId);
  const o = options(opts, 'materializeRunStateFromEvents options', ['pricing']);
  const text = jsonOf(copy);
  const pricing = pricingText(o.pricing);
  return frozen<MaterializedRunState>(callSync(() => native.materializeEventsJson(runId, text, pricing)));
}
