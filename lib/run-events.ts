// Run events and session events: appending and reading them, the cost restore and the fold.
import { call, callSync, checkRunIdType, invalid } from './errors.js';
import type { EventEnvelope } from './envelopes.js';
import { frozen, isPlainRecord, jsonOf, snapshotOf } from './json.js';
import { native } from './native.js';
import { nativeOf, wakeSubscribers, type World } from './worlds.js';

/** A run event or session event without its envelope: `{ type: 'node:completed', nodeId, … }`. */
export type RunEventDraft = { type: string; [field: string]: unknown };

/**
 * A draft of an interface type: an interface has no index signature, so it is no
 * {@link RunEventDraft} to TypeScript. The append functions take both.
 */
export type InterfaceDraft = { readonly type: string };
/** A session event without its envelope: `{ type: 'session:turn_started', … }`. */
export type SessionEventDraft = RunEventDraft;

/** A stored run event: the draft's fields plus its envelope. */
export type RunEvent = {
  readonly type: string;
  readonly runId: string;
  /** ISO-8601, the envelope's recordedAt. */
  readonly timestamp: string;
  /** The envelope's sequence: dense per run. */
  readonly sequenceNumber: number;
  readonly [field: string]: unknown;
};

/** A stored session event: the draft's fields plus its envelope. */
export type SessionEvent = {
  readonly type: string;
  readonly sessionId: string;
  readonly timestamp: string;
  /** Dense per session. */
  readonly sequenceNumber: number;
  readonly [field: string]: unknown;
};

/** A run's costs as restored from its run events, in integer micro-cents. */
export type RunCosts = {
  /** The maximum over every durable absolute total (never a sum of deltas, never cost:updated). */
  readonly realizedCostMicrocents: number;
  /** Committed estimates less releases. */
  readonly conservativeMicrocents: number;
  readonly conservativeByModel: Readonly<Record<string, number>>;
  /** cost:attempt_settled rows with priced: false. */
  readonly unpricedAttempts: number;
};

/** A run's state folded from its run events (see `crates/vocabularies/src/run_events/fold.rs`). */
export type RunEventState = {
  readonly status: 'pending' | 'running' | 'paused' | 'completed' | 'failed' | 'cancelled';
  readonly error?: unknown;
  readonly nodes: Readonly<Record<string, {
    readonly status: 'running' | 'retrying' | 'completed' | 'failed' | 'skipped' | 'waiting';
    readonly attempts: number;
    readonly selected?: readonly string[];
    readonly skipReason?: string;
    readonly error?: unknown;
    readonly cumulativeCostMicrocents?: number;
  }>>;
  readonly pendingGates: readonly { readonly gateId: string; readonly nodeId: string; readonly gateType: string }[];
  readonly pendingMediaJobs: readonly Readonly<Record<string, unknown>>[];
  readonly budget: Readonly<Record<string, unknown>>;
  readonly timeout?: { readonly elapsedMs: number; readonly timeoutMs: number };
  readonly costs: RunCosts;
  /** One entry per run:paused whose aggregate disagrees with the gates and media jobs still open. */
  readonly pausedAggregateMismatch?: readonly Readonly<Record<string, unknown>>[];
};

function checkDraft(draft: unknown, streamId: string): string {
  // A run event's errors never echo a credential, even as an object key on the way to a bad value.
  const copy = snapshotOf(draft, 'event', { runId: streamId, screenKeys: true });
  if (!isPlainRecord(copy)) invalid('event', 'must be an object with a type', streamId);
  if (typeof copy.type !== 'string') invalid('event.type', 'must be a string naming the event type', streamId);
  return jsonOf(copy);
}

function asRunEvent<T>(env: EventEnvelope, idKey: 'runId' | 'sessionId'): T {
  return Object.freeze({ ...env.payload, type: env.type, [idKey]: env.runId, timestamp: env.recordedAt, sequenceNumber: env.sequence }) as T;
}

/** {@link appendRunEvent} with a draft of an interface type (see {@link InterfaceDraft}). */
export async function appendRunEvent(world: World, runId: string, event: InterfaceDraft): Promise<RunEvent>;
/**
 * Append a run event, validated strictly on write (its type, fields, closed enums, integer
 * micro-cents and token counts, each type's cross-field refinements; no credential anywhere;
 * nothing after the run's terminal event and exactly one terminal per node). Resolves with the
 * stored event.
 */
export async function appendRunEvent(world: World, runId: string, event: RunEventDraft): Promise<RunEvent>;
export async function appendRunEvent(world: World, runId: string, event: RunEventDraft | InterfaceDraft): Promise<RunEvent> {
  const handle = nativeOf(world);
  checkRunIdType(runId);
  const text = checkDraft(event, runId);
  const env = frozen<EventEnvelope>(await call(() => handle.appendDraft(runId, text, false)));
  wakeSubscribers(world, runId);
  return asRunEvent<RunEvent>(env, 'runId');
}

/** {@link appendSessionEvent} with a draft of an interface type (see {@link InterfaceDraft}). */
export async function appendSessionEvent(world: World, sessionId: string, event: InterfaceDraft): Promise<SessionEvent>;
/** Append a session event (`session:*` and the dual-envelope types); sessions are numbered on their own. */
export async function appendSessionEvent(world: World, sessionId: string, event: SessionEventDraft): Promise<SessionEvent>;
export async function appendSessionEvent(world: World, sessionId: string, event: SessionEventDraft | InterfaceDraft): Promise<SessionEvent> {
  const handle = nativeOf(world);
  checkRunIdType(sessionId, 'sessionId');
  const text = checkDraft(event, sessionId);
  const env = frozen<EventEnvelope>(await call(() => handle.appendDraft(sessionId, text, true)));
  wakeSubscribers(world, sessionId);
  return asRunEvent<SessionEvent>(env, 'sessionId');
}

/** {@link listRunEvents} of a run: its run events, which {@link foldRunEvents} takes as they are. */
export async function listRunEvents(world: World, runId: `run_${string}`): Promise<readonly RunEvent[]>;
/** {@link listRunEvents} of a session: its session events. */
export async function listRunEvents(world: World, sessionId: `ses_${string}`): Promise<readonly SessionEvent[]>;
/**
 * The tolerant display read of a run's (or session's) events: a row of a type this build does not
 * know (a newer writer's) is dropped; a known type whose body does not parse throws
 * `EventLogCorruptError`.
 */
export async function listRunEvents(world: World, streamId: string): Promise<readonly (RunEvent | SessionEvent)[]>;
export async function listRunEvents(world: World, streamId: string): Promise<readonly (RunEvent | SessionEvent)[]> {
  const handle = nativeOf(world);
  checkRunIdType(streamId, 'streamId');
  return frozen<(RunEvent | SessionEvent)[]>(await call(() => handle.runEvents(streamId, false)));
}

/**
 * The strict replay read: refuses with `ReplayRefusedError` (naming the rows in `details.sequences`)
 * when any row would be dropped, because a replay cannot skip what it does not understand.
 */
export async function loadRunEventLogForReplay(world: World, runId: string): Promise<readonly RunEvent[]> {
  const handle = nativeOf(world);
  checkRunIdType(runId);
  return frozen<RunEvent[]>(await call(() => handle.runEvents(runId, true)));
}

/** Restore a run's costs from its events by the run-event vocabulary's cost rules; row order does not matter. */
export function restoreRunCosts(events: readonly RunEvent[]): RunCosts {
  const text = runEventsText(events);
  return frozen<RunCosts>(callSync(() => native.restoreRunCostsJson(text)));
}

/** Fold a run's events into its status, nodes, pending gates and media jobs, budget, timeout and costs. */
export function foldRunEvents(events: readonly RunEvent[]): RunEventState {
  const text = runEventsText(events);
  return frozen<RunEventState>(callSync(() => native.foldRunEventsJson(text)));
}

/** JSON text of a list of run events, read once. */
function runEventsText(events: readonly RunEvent[]): string {
  const copy = snapshotOf(events, 'events', { screenKeys: true, around: 1 });
  if (!Array.isArray(copy)) invalid('events', 'must be an array of run events');
  return jsonOf(copy);
}
