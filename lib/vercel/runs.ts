// SDK runs as our event logs: each SDK event one envelope of the run's log, the run, step, hook
// and wait entities folded from them, and each transition checked against the state it folds
// and committed only if no other writer appended in between (`expectedSequence`).
//
// A run's event ids follow the scheme of the spec version it was created at, for its whole life.
// From the line's slot-identity version on, an event's id is its position among the run's SDK
// events (`evnt_` + the position, formatted by the line's own helper), dense from 1: the log is
// dense, each position taken at the commit that occupies it, so no position is ever left empty
// (a sealed log by construction). Runs of earlier versions keep ids made of their envelope's
// sequence.
import type { Event, EventResult, Hook, Step, Wait, WorkflowRun } from '@workflow/world';
import { WorkflowWorldError } from './errors.js';
import { eventIdOf, logOfRun } from './ids.js';
import { installedLine, type SdkLine } from './line.js';
import { append, appendEvents, decode, defineField, encode, indexConflictHolder, isSequenceConflict, listEvents, type EventEnvelope, type IndexWrite, type World } from './store.js';

/** Index names: runs by status and by workflow name, hook tokens and ids, correlation ids. */
export const INDEX = {
  runStatus: 'workflow.run.status',
  runName: 'workflow.run.name',
  hookToken: 'workflow.hook.token',
  hook: 'workflow.hook',
  correlation: 'workflow.correlation',
} as const;

/** The event type of an SDK event in our logs. */
export const TYPE_PREFIX = 'workflow.';

type Data = Record<string, unknown>;
/**
 * An SDK event as folded. `resumePayloadDigest` is this World's own record of a deduplicated
 * resume, never handed out (see `strip`).
 */
export type SdkEvent = Event & { eventData?: Data; correlationId?: string; resumeId?: string; resumePayloadDigest?: string };

/** A hook, and whether it was disposed (a disposed hook keeps its id taken). */
type HookState = { hook: Hook; live: boolean };

/** What a run's log folds to. */
export type RunState = {
  run?: WorkflowRun;
  steps: Map<string, Step>;
  hooks: Map<string, HookState>;
  waits: Map<string, Wait>;
  /** Correlation ids seen, and workflow-written attribute events' ids. */
  correlations: Set<string>;
  attrEvents: Set<string>;
  /** The `hook_received` event of each resume id (`resumeHook`'s idempotency key). */
  resumes: Map<string, SdkEvent>;
  events: SdkEvent[];
  lastSequence: number;
  /** The id of the envelope at `lastSequence`. */
  lastEventId?: string;
  /** Whether the run's event ids are slots (decided by the spec version it was created at). */
  slotIds?: boolean;
};

function emptyState(): RunState {
  return { steps: new Map(), hooks: new Map(), waits: new Map(), correlations: new Set(), attrEvents: new Set(), resumes: new Map(), events: [], lastSequence: 0 };
}

/** A copy of `state` that events may be applied to without changing it. */
export function copyState(state: RunState): RunState {
  return {
    ...state,
    steps: new Map(state.steps),
    hooks: new Map([...state.hooks].map(([id, h]) => [id, { ...h }])),
    waits: new Map(state.waits),
    correlations: new Set(state.correlations),
    attrEvents: new Set(state.attrEvents),
    resumes: new Map(state.resumes),
    events: [...state.events],
  };
}

export const TERMINAL_RUN = new Set(['completed', 'failed', 'cancelled']);
export const TERMINAL_STEP = new Set(['completed', 'failed', 'cancelled']);
export const TERMINAL_RUN_EVENTS = new Set(['run_completed', 'run_failed', 'run_cancelled']);
export const STEP_EVENTS = new Set(['step_created', 'step_started', 'step_completed', 'step_failed', 'step_retrying']);
export const CHILD_CREATIONS = new Set(['step_created', 'hook_created', 'wait_created']);

/** The field of each event type that holds user data, left out when `resolveData` is `'none'`. */
const REF_FIELD: Record<string, string> = {
  run_created: 'input',
  run_started: 'input',
  run_completed: 'output',
  run_failed: 'error',
  step_created: 'input',
  step_started: 'input',
  step_completed: 'result',
  step_failed: 'error',
  step_retrying: 'error',
  hook_created: 'metadata',
  hook_received: 'payload',
};

export type ResolveData = 'all' | 'none';

/**
 * `event` as a reader asked for it (with `'none'`, without its user data), as a copy: callers
 * may change what they are given (the SDK replaces a hook's `metadata` with its decoded value),
 * and what the cache holds must stay as stored.
 */
export function strip(event: SdkEvent, resolveData: ResolveData | undefined): SdkEvent {
  if (event.resumePayloadDigest !== undefined) {
    const { resumePayloadDigest: _digest, ...rest } = event;
    return strip(rest as SdkEvent, resolveData);
  }
  if (resolveData !== 'none' || event.eventData === undefined) return structuredClone(event);
  const field = REF_FIELD[event.eventType];
  if (field === undefined) return structuredClone(event);
  const { [field]: _dropped, ...rest } = event.eventData;
  const { eventData: _data, ...bare } = event;
  return structuredClone((Object.keys(rest).length > 0 ? { ...bare, eventData: rest } : bare) as SdkEvent);
}

function isRecord(v: unknown): v is Data {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

/** Apply one SDK event to the state. The log holds only events checked when appended. */
export function apply(state: RunState, e: SdkEvent): void {
  const d = e.eventData ?? {};
  const at = e.createdAt;
  const cid = e.correlationId;
  state.events.push(e);
  if (cid !== undefined) state.correlations.add(cid);
  const run = state.run as (WorkflowRun & Data) | undefined;
  /** A step's event: the step (if created) with the fields `change` gives it. */
  const updateStep = (change: (step: Step) => Partial<Step>): void => {
    const step = state.steps.get(cid as string);
    if (step) state.steps.set(cid as string, { ...step, ...change(step), updatedAt: at } as Step);
  };
  if (e.eventType === 'hook_received' && e.resumeId !== undefined) state.resumes.set(e.resumeId, e);
  switch (e.eventType) {
    case 'run_created':
      state.run = {
        runId: e.runId,
        deploymentId: d.deploymentId as string,
        status: 'pending',
        workflowName: d.workflowName as string,
        specVersion: e.specVersion,
        executionContext: d.executionContext as Record<string, unknown> | undefined,
        input: d.input,
        attributes: { ...((d.attributes as Record<string, string> | undefined) ?? {}) },
        createdAt: at,
        updatedAt: at,
      } as WorkflowRun;
      return;
    case 'run_started':
      if (run) state.run = { ...run, status: 'running', startedAt: run.startedAt ?? at, updatedAt: at } as WorkflowRun;
      return;
    case 'run_completed':
      if (run) state.run = { ...run, status: 'completed', output: d.output, completedAt: at, updatedAt: at } as WorkflowRun;
      endRun(state);
      return;
    case 'run_failed':
      if (run) state.run = { ...run, status: 'failed', error: d.error, errorCode: d.errorCode as string | undefined, completedAt: at, updatedAt: at } as WorkflowRun;
      endRun(state);
      return;
    case 'run_cancelled':
      if (run && run.status !== 'cancelled') state.run = { ...run, status: 'cancelled', completedAt: at, updatedAt: at } as WorkflowRun;
      endRun(state);
      return;
    case 'attr_set': {
      if (!run) return;
      const attributes = { ...run.attributes };
      for (const c of (d.changes as Array<{ key: string; value: string | null }>) ?? []) {
        if (c.value === null) delete attributes[c.key];
        else defineField(attributes, c.key, c.value);
      }
      state.run = { ...run, attributes, updatedAt: at } as WorkflowRun;
      if (cid !== undefined && (d.writer as Data | undefined)?.type === 'workflow') state.attrEvents.add(cid);
      return;
    }
    case 'step_created':
      state.steps.set(cid as string, {
        runId: e.runId,
        stepId: cid as string,
        stepName: d.stepName as string,
        status: 'pending',
        input: d.input,
        attempt: 0,
        createdAt: at,
        updatedAt: at,
        specVersion: e.specVersion,
      } as Step);
      return;
    case 'step_started':
      return updateStep((step) => ({ status: 'running', attempt: step.attempt + 1, startedAt: step.startedAt ?? at, retryAfter: undefined }));
    case 'step_completed':
      return updateStep(() => ({ status: 'completed', output: d.result, completedAt: at }));
    case 'step_failed':
      return updateStep(() => ({ status: 'failed', error: d.error as Step['error'], completedAt: at }));
    case 'step_retrying':
      return updateStep(() => ({ status: 'pending', error: d.error as Step['error'], retryAfter: d.retryAfter as Date | undefined }));
    case 'hook_created':
      state.hooks.set(cid as string, {
        live: true,
        hook: {
          runId: e.runId,
          hookId: cid as string,
          token: d.token as string,
          metadata: d.metadata,
          ownerId: 'little-owner',
          projectId: 'little-project',
          environment: 'local',
          createdAt: at,
          specVersion: e.specVersion,
          isWebhook: (d.isWebhook as boolean | undefined) ?? false,
          isSystem: (d.isSystem as boolean | undefined) ?? false,
        } as Hook,
      });
      return;
    case 'hook_disposed': {
      const h = state.hooks.get(cid as string);
      if (h) h.live = false;
      return;
    }
    case 'wait_created':
      state.waits.set(cid as string, {
        waitId: `${e.runId}-${cid}`,
        runId: e.runId,
        status: 'waiting',
        resumeAt: d.resumeAt as Date | undefined,
        createdAt: at,
        updatedAt: at,
        specVersion: e.specVersion,
      } as Wait);
      return;
    case 'wait_completed': {
      const w = state.waits.get(cid as string);
      if (w) state.waits.set(cid as string, { ...w, status: 'completed', completedAt: at, updatedAt: at });
      return;
    }
  }
}

/** A terminal run's hooks are disposed (their tokens free again). */
function endRun(state: RunState): void {
  for (const h of state.hooks.values()) h.live = false;
}

/** The SDK events one envelope holds: an entity created on the way first, then the event itself. */
async function sdkEventsOf(world: World, sdkRunId: string, env: EventEnvelope): Promise<SdkEvent[]> {
  if (!env.type.startsWith(TYPE_PREFIX)) return [];
  const eventType = env.type.slice(TYPE_PREFIX.length);
  const p = (await decode(env.payload, world)) as Data;
  const createdAt = new Date(env.recordedAt);
  const out: SdkEvent[] = [];
  const created = p.created as Data | undefined;
  if (created !== undefined) {
    out.push(sdkEvent(sdkRunId, env.sequence, 0, created.eventType as string, created, createdAt));
  }
  out.push(sdkEvent(sdkRunId, env.sequence, out.length, eventType, p, createdAt));
  return out;
}

export function sdkEvent(runId: string, sequence: number, part: number, eventType: string, p: Data, createdAt: Date): SdkEvent {
  const e: Data = { eventType, runId, eventId: eventIdOf(sequence, part), createdAt };
  if (typeof p.correlationId === 'string') e.correlationId = p.correlationId;
  if (typeof p.specVersion === 'number') e.specVersion = p.specVersion;
  if (isRecord(p.eventData)) e.eventData = p.eventData;
  if (typeof p.resumeId === 'string') e.resumeId = p.resumeId;
  if (typeof p.resumePayloadDigest === 'string') e.resumePayloadDigest = p.resumePayloadDigest;
  return e as unknown as SdkEvent;
}

/** What to store of an SDK event: everything but the ids and time our envelope has. */
export async function payloadOf(
  world: World,
  sdkRunId: string,
  e: { eventType: string; correlationId?: string; specVersion?: number; eventData?: unknown; resumeId?: string; resumePayloadDigest?: string },
): Promise<Data> {
  const home = { world, runId: logOfRun(sdkRunId), name: `${e.eventType}.eventData` };
  const p: Data = {};
  if (e.correlationId !== undefined) p.correlationId = e.correlationId;
  if (e.specVersion !== undefined) p.specVersion = e.specVersion;
  if (e.resumeId !== undefined) p.resumeId = e.resumeId;
  if (e.resumePayloadDigest !== undefined) p.resumePayloadDigest = e.resumePayloadDigest;
  if (e.eventData !== undefined) p.eventData = await encode(e.eventData, home);
  return p;
}

/** How many runs' folded states a process keeps. */
const CACHED_RUNS = 256;

/**
 * Per-process folded state of runs, and the turn each run's writers of this process take.
 *
 * A PostgreSQL store can lose commits it had acknowledged (a server that crashed at `durability:
 * 'normal'`, a failover to a replica that had not received them) and give their sequences to other
 * events. There a run's state is brought up to date from its last event folded, which must still
 * be stored: when it is not, the state is folded again from the log's start. Folded further, it
 * would join two histories; and an append expecting a sequence the log no longer reaches would
 * conflict for ever.
 */
export class RunCache {
  private readonly states = new Map<string, RunState>();
  private readonly turns = new Map<string, Promise<unknown>>();
  private readonly forgetful: boolean;

  /** @param line The SDK line served (default: the app's). */
  constructor(
    private readonly world: World,
    readonly line: SdkLine = installedLine(),
  ) {
    this.forgetful = world.kind === 'postgres';
  }

  /** The run's state, brought up to date with its log. */
  async refresh(sdkRunId: string): Promise<RunState> {
    let state = this.states.get(sdkRunId);
    if (state === undefined) state = emptyState();
    else this.states.delete(sdkRunId); // re-inserted below: most recently used last
    const log = logOfRun(sdkRunId);
    let fresh: readonly EventEnvelope[];
    if (this.forgetful && state.lastSequence > 0) {
      const listed = await listEvents(this.world, log, { afterSequence: state.lastSequence - 1 });
      const last = listed[0];
      if (last !== undefined && last.sequence === state.lastSequence && last.eventId === state.lastEventId) {
        fresh = listed.slice(1);
      } else {
        state = emptyState();
        fresh = await listEvents(this.world, log);
      }
    } else {
      fresh = await listEvents(this.world, log, { afterSequence: state.lastSequence });
    }
    for (const env of fresh) this.applyEnvelope(state, sdkRunId, await sdkEventsOf(this.world, sdkRunId, env), env);
    this.states.set(sdkRunId, state);
    while (this.states.size > CACHED_RUNS) this.states.delete(this.states.keys().next().value as string);
    return state;
  }

  private applyEnvelope(state: RunState, _sdkRunId: string, events: SdkEvent[], env: EventEnvelope): void {
    if (env.sequence !== state.lastSequence + 1) throw new Error(`event ${env.sequence} folded out of order after ${state.lastSequence}`);
    const slots = this.line.slots;
    for (const e of events) {
      if (state.events.length === 0) state.slotIds = slots !== undefined && typeof e.specVersion === 'number' && e.specVersion >= slots.fromSpecVersion;
      if (state.slotIds) e.eventId = (slots as NonNullable<typeof slots>).eventId(state.events.length + 1);
      apply(state, e);
    }
    state.lastSequence = env.sequence;
    state.lastEventId = env.eventId;
  }

  /** Run `f` when this process's previous writer of the run is done. */
  inTurn<T>(sdkRunId: string, f: () => Promise<T>): Promise<T> {
    const prev = this.turns.get(sdkRunId) ?? Promise.resolve();
    const next = prev.then(f, f);
    const settled = next.catch(() => undefined);
    this.turns.set(sdkRunId, settled);
    void settled.then(() => {
      if (this.turns.get(sdkRunId) === settled) this.turns.delete(sdkRunId);
    });
    return next;
  }

  /**
   * Append what `decide` makes of the up-to-date state, committed only if the log has not grown
   * since: when another writer got there first, refresh and decide again, at most
   * {@link MAX_ATTEMPTS} times.
   */
  async transition<T>(sdkRunId: string, decide: (state: RunState) => Promise<Decision<T>>): Promise<T> {
    return this.inTurn(sdkRunId, async () => {
      for (let attempt = 1; attempt <= MAX_ATTEMPTS; attempt++) {
        const state = await this.refresh(sdkRunId);
        const d = await decide(state);
        if (d.kind === 'done') return d.value;
        const committed = await this.commitFirst(sdkRunId, state, d);
        if (committed !== undefined) return committed.value;
      }
      // Another writer appended to the run between each read and commit: the queue delivers the
      // message again later, when the run is quieter.
      throw new WorkflowWorldError(`run "${sdkRunId}": other writers appended before each of ${MAX_ATTEMPTS} attempts to commit; try again`, { status: 503 });
    });
  }

  /**
   * Commit `d` after `state`, or, when it claims an index entry another run holds, what its
   * `onIndexConflict` makes instead. `undefined` when another writer appended first.
   */
  private async commitFirst<T>(sdkRunId: string, state: RunState, d: Extract<Decision<T>, { kind: 'append' }>): Promise<{ value: T } | undefined> {
    try {
      return { value: await this.commit(sdkRunId, state, d) };
    } catch (err) {
      if (isSequenceConflict(err)) return undefined;
      const holder = indexConflictHolder(err);
      const other = holder !== undefined && d.onIndexConflict ? await d.onIndexConflict(holder.holderRunId) : undefined;
      if (other === undefined) throw err;
      try {
        return { value: await this.commit(sdkRunId, state, other) };
      } catch (err2) {
        if (isSequenceConflict(err2)) return undefined;
        throw err2;
      }
    }
  }

  /**
   * Append `c`'s envelopes after `state`'s last, together (one transaction), and fold them in:
   * its result is what `c.result` makes of the SDK events they hold.
   */
  private async commit<T>(sdkRunId: string, state: RunState, c: Commit<T>): Promise<T> {
    const log = logOfRun(sdkRunId);
    const [first, ...rest] = c.appends;
    const expectedSequence = state.lastSequence;
    const envs =
      rest.length === 0
        ? [await append(this.world, log, { ...first, expectedSequence })]
        : await appendEvents(this.world, log, [{ ...first, expectedSequence }, ...rest]);
    const events: SdkEvent[] = [];
    for (const env of envs) {
      const held = await sdkEventsOf(this.world, sdkRunId, env);
      if (state.lastSequence + 1 === env.sequence) this.applyEnvelope(state, sdkRunId, held, env);
      events.push(...held);
    }
    return c.result(events, state);
  }
}

/** How many times a transition reads and decides again when another writer appended first. */
const MAX_ATTEMPTS = 100;

/** One envelope of a transition: an SDK event as stored, and the index writes it makes. */
export type Append = { type: string; payload: Data; index?: IndexWrite[] };
/** What a transition appends (one envelope per SDK event, committed together) and answers. */
export type Commit<T> = { appends: Append[]; result: (events: SdkEvent[], state: RunState) => T };
export type Decision<T> =
  | { kind: 'done'; value: T }
  | ({ kind: 'append'; onIndexConflict?: (holderRunId: string | undefined) => Promise<Commit<T> | undefined> } & Commit<T>);

export type CreateParams = { resolveData?: ResolveData; sinceCursor?: string; skipPreload?: boolean; eventCount?: number; resumeId?: string; resumePayloadDigest?: string };
export type EventRequest = { eventType: string; correlationId?: string; specVersion?: number; eventData?: Data; resumeId?: string; resumePayloadDigest?: string };

/** A run's entities as `events.create` returns them. */
export function resultOf(state: RunState, e: SdkEvent, params: CreateParams | undefined): EventResult {
  const out: Data = { event: strip(e, params?.resolveData) };
  const cid = e.correlationId;
  if (e.eventType.startsWith('run_') || e.eventType === 'attr_set') out.run = state.run;
  if (STEP_EVENTS.has(e.eventType) && cid !== undefined) out.step = state.steps.get(cid);
  if (e.eventType === 'hook_created' && cid !== undefined) out.hook = state.hooks.get(cid)?.hook;
  if (e.eventType.startsWith('wait_') && cid !== undefined) out.wait = state.waits.get(cid);
  // Copies, as `strip` gives: the cache's entities are never handed out.
  return structuredClone(out) as EventResult;
}

/** The events after a cursor (an event id), a page as `events.list` gives it. */
export function pageOf(events: readonly SdkEvent[], cursor: string | undefined, limit: number | undefined, order: 'asc' | 'desc', resolveData?: ResolveData) {
  const all = order === 'asc' ? events : [...events].reverse();
  let start = 0;
  if (cursor) {
    const i = all.findIndex((e) => e.eventId === cursor);
    if (i >= 0) start = i + 1;
    else {
      // An id not in the list: the first event past it in this order.
      start = all.findIndex((e) => (order === 'asc' ? e.eventId > cursor : e.eventId < cursor));
      if (start < 0) start = all.length;
    }
  }
  const n = Math.min(Math.max(limit ?? 100, 1), 1000);
  const data = all.slice(start, start + n).map((e) => strip(e, resolveData));
  const hasMore = start + n < all.length;
  const last = data[data.length - 1];
  return { data, cursor: last ? last.eventId : (cursor ?? null), hasMore };
}

/** An event of a run by its SDK id. */
export function findEvent(state: RunState, eventId: string): SdkEvent | undefined {
  return state.events.find((e) => e.eventId === eventId);
}
