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
import { EntityConflictError, HookNotFoundError, RunExpiredError, RunNotSupportedError, TooEarlyError, WorkflowRunNotFoundError, WorkflowWorldError } from './errors.js';
import { eventIdOf, logOfRun, ulid } from './ids.js';
import { installedLine, type SdkLine } from './line.js';
import { append, decode, defineField, encode, indexConflictHolder, indexText, isSequenceConflict, listEvents, type EventEnvelope, type IndexWrite, type World } from './store.js';

/** Index names: runs by status and by workflow name, hook tokens and ids, correlation ids. */
export const INDEX = {
  runStatus: 'workflow.run.status',
  runName: 'workflow.run.name',
  hookToken: 'workflow.hook.token',
  hook: 'workflow.hook',
  correlation: 'workflow.correlation',
} as const;

/** The event type of an SDK event in our logs. */
const TYPE_PREFIX = 'workflow.';

type Data = Record<string, unknown>;
/**
 * An SDK event as folded. `resumePayloadDigest` is this World's own record of a deduplicated
 * resume, never handed out (see `strip`).
 */
type SdkEvent = Event & { eventData?: Data; correlationId?: string; resumeId?: string; resumePayloadDigest?: string };

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

const TERMINAL_RUN = new Set(['completed', 'failed', 'cancelled']);
const TERMINAL_STEP = new Set(['completed', 'failed', 'cancelled']);
const TERMINAL_RUN_EVENTS = new Set(['run_completed', 'run_failed', 'run_cancelled']);
const STEP_EVENTS = new Set(['step_created', 'step_started', 'step_completed', 'step_failed', 'step_retrying']);
const CHILD_CREATIONS = new Set(['step_created', 'hook_created', 'wait_created']);

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
function apply(state: RunState, e: SdkEvent): void {
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

function sdkEvent(runId: string, sequence: number, part: number, eventType: string, p: Data, createdAt: Date): SdkEvent {
  const e: Data = { eventType, runId, eventId: eventIdOf(sequence, part), createdAt };
  if (typeof p.correlationId === 'string') e.correlationId = p.correlationId;
  if (typeof p.specVersion === 'number') e.specVersion = p.specVersion;
  if (isRecord(p.eventData)) e.eventData = p.eventData;
  if (typeof p.resumeId === 'string') e.resumeId = p.resumeId;
  if (typeof p.resumePayloadDigest === 'string') e.resumePayloadDigest = p.resumePayloadDigest;
  return e as unknown as SdkEvent;
}

/** What to store of an SDK event: everything but the ids and time our envelope has. */
async function payloadOf(
  world: World,
  sdkRunId: string,
  e: { eventType: string; correlationId?: string; specVersion?: number; eventData?: unknown; resumeId?: string; resumePayloadDigest?: string },
  created?: Data,
): Promise<Data> {
  const home = { world, runId: logOfRun(sdkRunId), name: `${e.eventType}.eventData` };
  const p: Data = {};
  if (e.correlationId !== undefined) p.correlationId = e.correlationId;
  if (e.specVersion !== undefined) p.specVersion = e.specVersion;
  if (e.resumeId !== undefined) p.resumeId = e.resumeId;
  if (e.resumePayloadDigest !== undefined) p.resumePayloadDigest = e.resumePayloadDigest;
  if (e.eventData !== undefined) p.eventData = await encode(e.eventData, home);
  if (created !== undefined) p.created = await encode(created, { ...home, name: `${created.eventType}.eventData` });
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
   * since: when another writer got there first, refresh and decide again.
   */
  async transition<T>(sdkRunId: string, decide: (state: RunState) => Promise<Decision<T>>): Promise<T> {
    return this.inTurn(sdkRunId, async () => {
      for (;;) {
        const state = await this.refresh(sdkRunId);
        const d = await decide(state);
        if (d.kind === 'done') return d.value;
        let env: EventEnvelope;
        try {
          env = await append(this.world, logOfRun(sdkRunId), { type: d.type, payload: d.payload, expectedSequence: state.lastSequence, index: d.index });
        } catch (err) {
          if (isSequenceConflict(err)) continue;
          const holder = indexConflictHolder(err);
          if (holder !== undefined && d.onIndexConflict) {
            const other = await d.onIndexConflict(holder.holderRunId);
            if (other !== undefined) {
              try {
                env = await append(this.world, logOfRun(sdkRunId), { type: other.type, payload: other.payload, expectedSequence: state.lastSequence, index: other.index });
              } catch (err2) {
                if (isSequenceConflict(err2)) continue;
                throw err2;
              }
              const events = await sdkEventsOf(this.world, sdkRunId, env);
              if (state.lastSequence + 1 === env.sequence) this.applyEnvelope(state, sdkRunId, events, env);
              return other.result(events, state);
            }
          }
          throw err;
        }
        const events = await sdkEventsOf(this.world, sdkRunId, env);
        if (state.lastSequence + 1 === env.sequence) this.applyEnvelope(state, sdkRunId, events, env);
        return d.result(events, state);
      }
    });
  }
}

type Commit<T> = { type: string; payload: Data; index?: IndexWrite[]; result: (events: SdkEvent[], state: RunState) => T };
type Decision<T> =
  | { kind: 'done'; value: T }
  | ({ kind: 'append'; onIndexConflict?: (holderRunId: string | undefined) => Promise<Commit<T> | undefined> } & Commit<T>);

type CreateParams = { resolveData?: ResolveData; sinceCursor?: string; skipPreload?: boolean; eventCount?: number; resumeId?: string; resumePayloadDigest?: string };
type EventRequest = { eventType: string; correlationId?: string; specVersion?: number; eventData?: Data };

/** A run's entities as `events.create` returns them. */
function resultOf(state: RunState, e: SdkEvent, params: CreateParams | undefined): EventResult {
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

/** The index writes of a run's status changing to `status`, and of its terminal release of tokens. */
function statusIndex(sdkRunId: string, state: RunState, status: string): IndexWrite[] {
  const writes: IndexWrite[] = [{ index: INDEX.runStatus, key: sdkRunId, value: status }];
  if (TERMINAL_RUN.has(status)) {
    for (const h of state.hooks.values()) if (h.live) writes.push({ index: INDEX.hookToken, key: indexText(h.hook.token), value: null });
  }
  return writes;
}

function correlationIndex(sdkRunId: string, state: RunState, cid: string | undefined): IndexWrite[] {
  if (cid === undefined || state.correlations.has(cid)) return [];
  return [{ index: INDEX.correlation, key: `${sdkRunId}\n${indexText(cid)}`, value: indexText(cid) }];
}

/**
 * The SDK's own rules for run attributes (reserved keys, sizes, count): its
 * `AttributeValidationError`. A line without attributes (4.x) has no rules, and sends none.
 */
function checkAttributes(line: SdkLine, changes: { key: string; value: unknown }[], allowReservedAttributes: boolean, existingKeys?: string[]): void {
  line.validateAttributeChanges?.(changes, { allowReservedAttributes, existingKeys });
}

/** `events.create`: check the event against the run's state and append it. */
export async function createEvent(cache: RunCache, world: World, runIdArg: string | null, data: EventRequest, params?: CreateParams): Promise<EventResult> {
  const eventType = data.eventType;
  let sdkRunId: string;
  if (eventType === 'run_created') sdkRunId = runIdArg || `wrun_${ulid()}`;
  else if (!runIdArg) throw new WorkflowWorldError('runId is required for non-run_created events', { status: 400 });
  else sdkRunId = runIdArg;
  if (!/^[A-Za-z0-9_-]{1,76}$/.test(sdkRunId)) throw new WorkflowWorldError(`invalid runId ${JSON.stringify(sdkRunId)}`, { status: 400 });
  const line = cache.line;
  const specVersion = data.specVersion ?? line.minted();
  const req: EventRequest = { ...data, specVersion };
  const cid = data.correlationId;
  if (cid !== undefined && (typeof cid !== 'string' || cid.length === 0)) {
    throw new WorkflowWorldError(`invalid correlationId ${JSON.stringify(cid)}`, { status: 400 });
  }
  const type = `${TYPE_PREFIX}${eventType}`;

  /** `result` with, when the writer passed `sinceCursor`, the events after it (the inline delta). */
  const withDelta =
    (result: Commit<EventResult>['result']): Commit<EventResult>['result'] =>
    (events, s) => {
      const r = result(events, s) as EventResult & Data;
      if (typeof params?.sinceCursor === 'string') {
        const page = pageOf(s.events, params.sinceCursor, 1000, 'asc', params.resolveData);
        r.events = page.data;
        r.cursor = page.cursor;
        r.hasMore = page.hasMore;
      }
      return r;
    };

  const decide = async (state: RunState): Promise<Decision<EventResult>> => {
    const one = (events: SdkEvent[], s: RunState) => resultOf(s, events[events.length - 1], params);
    const plain = async (index: IndexWrite[] = [], created?: Data): Promise<Extract<Decision<EventResult>, { kind: 'append' }>> => ({
      kind: 'append',
      type,
      payload: await payloadOf(world, sdkRunId, req, created),
      index: [...index, ...correlationIndex(sdkRunId, state, cid)],
      result: one,
    });

    if (eventType === 'run_created') {
      if (state.run !== undefined || state.lastSequence > 0) throw new EntityConflictError(`Workflow run "${sdkRunId}" already exists`);
      const d = req.eventData ?? {};
      checkAttributes(line, Object.entries((d.attributes as Data | undefined) ?? {}).map(([key, value]) => ({ key, value })), d.allowReservedAttributes === true);
      return plain([
        { index: INDEX.runStatus, key: sdkRunId, value: 'pending' },
        { index: INDEX.runName, key: sdkRunId, value: indexText(String(d.workflowName)) },
      ]);
    }

    let run = state.run;
    let created: Data | undefined;
    const d = req.eventData ?? {};
    // Resilient start: a run_started carrying the run's input creates the run it starts.
    if (eventType === 'run_started' && run === undefined && typeof d.deploymentId === 'string' && typeof d.workflowName === 'string' && d.input !== undefined) {
      checkAttributes(line, Object.entries((d.attributes as Data | undefined) ?? {}).map(([key, value]) => ({ key, value })), d.allowReservedAttributes === true);
      created = {
        eventType: 'run_created',
        specVersion,
        eventData: {
          deploymentId: d.deploymentId,
          workflowName: d.workflowName,
          input: d.input,
          executionContext: d.executionContext,
          attributes: d.attributes,
          allowReservedAttributes: d.allowReservedAttributes,
        },
      };
    }
    if (run === undefined && created === undefined) throw new WorkflowRunNotFoundError(sdkRunId);
    if (run !== undefined && typeof run.specVersion === 'number' && run.specVersion > line.maxReadable) throw new RunNotSupportedError(run.specVersion, line.maxReadable);

    const lazyStep = eventType === 'step_started' && typeof d.stepName === 'string' && d.input !== undefined;
    const createsChild = CHILD_CREATIONS.has(eventType) || lazyStep;
    const status = run?.status;
    if (status !== undefined && TERMINAL_RUN.has(status)) {
      if (eventType === 'run_cancelled' && status === 'cancelled') return plain();
      if (eventType === 'run_started') throw new RunExpiredError(`Workflow run "${sdkRunId}" is already in terminal state "${status}"`);
      if (TERMINAL_RUN_EVENTS.has(eventType)) throw new EntityConflictError(`Cannot transition run from terminal state "${status}"`);
      if (createsChild) throw new EntityConflictError(`Cannot create new entities on run in terminal state "${status}"`);
      if (eventType === 'attr_set') throw new EntityConflictError(`Cannot set attributes on run in terminal state "${status}"`);
    }

    switch (eventType) {
      case 'run_started': {
        if (run?.status === 'running') return { kind: 'done', value: { run: structuredClone(run) } as EventResult };
        const index = created
          ? [
              { index: INDEX.runStatus, key: sdkRunId, value: 'running' },
              { index: INDEX.runName, key: sdkRunId, value: indexText(String(d.workflowName)) },
            ]
          : statusIndex(sdkRunId, state, 'running');
        // The run's input belongs on run_created only.
        const payload = await payloadOf(world, sdkRunId, { eventType, specVersion, correlationId: cid }, created);
        return {
          kind: 'append',
          type,
          payload,
          index,
          result: (events, s) => {
            const r = resultOf(s, events[events.length - 1], params) as EventResult & Data;
            // The log so far, so that the runtime need not list it first.
            if (!params?.skipPreload) {
              const page = pageOf(s.events, undefined, 1000, 'asc', params?.resolveData);
              r.events = page.data;
              r.cursor = page.cursor;
              r.hasMore = page.hasMore;
            }
            return r;
          },
        };
      }
      case 'run_completed':
        return plain(statusIndex(sdkRunId, state, 'completed'));
      case 'run_failed':
        return plain(statusIndex(sdkRunId, state, 'failed'));
      case 'run_cancelled':
        return plain(statusIndex(sdkRunId, state, 'cancelled'));
      case 'attr_set': {
        checkAttributes(line, (d.changes as { key: string; value: unknown }[] | undefined) ?? [], d.allowReservedAttributes === true, Object.keys(run?.attributes ?? {}));
        if (cid !== undefined && (d.writer as Data | undefined)?.type === 'workflow' && state.attrEvents.has(cid)) {
          throw new EntityConflictError(`Attribute event "${cid}" already exists`);
        }
        return plain();
      }
      case 'step_created':
        if (cid === undefined) throw new WorkflowWorldError('step_created needs a correlationId', { status: 400 });
        if (state.steps.has(cid)) throw new EntityConflictError(`Step "${cid}" already created`);
        return plain();
      case 'step_started':
      case 'step_completed':
      case 'step_failed':
      case 'step_retrying': {
        if (cid === undefined) throw new WorkflowWorldError(`${eventType} needs a correlationId`, { status: 400 });
        const step = state.steps.get(cid);
        if (step === undefined && !lazyStep) throw new WorkflowWorldError(`Step "${cid}" not found`, { status: 404 });
        if (lazyStep && step !== undefined) throw new EntityConflictError(`Step "${cid}" already created`);
        if (step !== undefined) {
          if (TERMINAL_STEP.has(step.status)) throw new EntityConflictError(`Cannot modify step in terminal state "${step.status}"`);
          if (status !== undefined && TERMINAL_RUN.has(status) && step.status !== 'running') {
            throw new RunExpiredError(`Cannot modify non-running step on run in terminal state "${status}"`);
          }
        }
        if (eventType === 'step_started') {
          if (step?.retryAfter !== undefined && step.retryAfter.getTime() > Date.now()) {
            const wait = Math.ceil((step.retryAfter.getTime() - Date.now()) / 1000);
            throw new TooEarlyError(`Cannot start step "${cid}": retryAfter timestamp has not been reached yet`, wait);
          }
          if (lazyStep) {
            // The step is created by this event: a synthetic step_created first, so replay sees it.
            const { input, ...rest } = d;
            const stepCreated: Data = { eventType: 'step_created', correlationId: cid, specVersion, eventData: { stepName: d.stepName, input } };
            return {
              kind: 'append',
              type,
              payload: await payloadOf(world, sdkRunId, { ...req, eventData: rest }, stepCreated),
              index: correlationIndex(sdkRunId, state, cid),
              result: (events, s) => ({ ...resultOf(s, events[events.length - 1], params), stepCreated: true }) as EventResult,
            };
          }
        }
        if (eventType === 'step_completed' || eventType === 'step_failed') return { ...(await plain()), result: withDelta(one) };
        return plain();
      }
      case 'hook_created': {
        if (cid === undefined) throw new WorkflowWorldError('hook_created needs a correlationId', { status: 400 });
        if (state.hooks.has(cid)) throw new EntityConflictError(`Hook "${cid}" already created`);
        const token = d.token;
        if (typeof token !== 'string' || token.length === 0) {
          throw new WorkflowWorldError('hook_created needs a token: a non-empty string', { status: 400 });
        }
        const conflict = async (holderRunId: string | undefined): Promise<Commit<EventResult>> => ({
          type: `${TYPE_PREFIX}hook_conflict`,
          payload: await payloadOf(world, sdkRunId, {
            eventType: 'hook_conflict',
            correlationId: cid,
            specVersion,
            eventData: { token, ...(holderRunId !== undefined ? { conflictingRunId: holderRunId } : {}) },
          }),
          index: correlationIndex(sdkRunId, state, cid),
          // The delta is answered on the conflict too: it settles the same awaiter.
          result: withDelta((events) => ({ event: strip(events[events.length - 1], params?.resolveData), hook: undefined }) as EventResult),
        });
        // A live hook of this run with the token: the run holds the index entry already.
        for (const h of state.hooks.values()) {
          if (h.live && h.hook.token === token) return { kind: 'append', ...(await conflict(sdkRunId)) };
        }
        const claim = await plain([
          { index: INDEX.hookToken, key: indexText(token), value: indexText(cid) },
          { index: INDEX.hook, key: `${sdkRunId}\n${indexText(cid)}`, value: indexText(cid) },
        ]);
        return {
          ...claim,
          result: withDelta(claim.result),
          onIndexConflict: async (holder) => conflict(holder?.startsWith('run_') ? holder.slice(4) : holder),
        };
      }
      case 'hook_received':
      case 'hook_disposed': {
        const resumeId = eventType === 'hook_received' && typeof params?.resumeId === 'string' ? params.resumeId : undefined;
        const digest = resumeId !== undefined && typeof params?.resumePayloadDigest === 'string' ? params.resumePayloadDigest : undefined;
        // A resume written again (a retry, the queue's re-ensure) is the event its first write committed.
        const resumed = resumeId !== undefined ? state.resumes.get(resumeId) : undefined;
        if (resumed !== undefined) {
          if (resumed.correlationId !== cid) throw new EntityConflictError(`hook_received resumeId "${resumeId}" already recorded for a different hook`);
          if (digest !== undefined && resumed.resumePayloadDigest !== undefined && digest !== resumed.resumePayloadDigest) {
            throw new EntityConflictError(`hook_received resumeId "${resumeId}" already recorded with a different payload`);
          }
          return { kind: 'done', value: { event: strip(resumed, params?.resolveData) } as EventResult };
        }
        const h = cid === undefined ? undefined : state.hooks.get(cid);
        if (h === undefined || !h.live) throw new HookNotFoundError(cid ?? '');
        if (eventType === 'hook_disposed') return plain([{ index: INDEX.hookToken, key: indexText(h.hook.token), value: null }]);
        if (resumeId === undefined) return plain();
        return {
          ...(await plain()),
          payload: await payloadOf(world, sdkRunId, { ...req, resumeId, resumePayloadDigest: digest }),
        };
      }
      case 'wait_created':
        if (cid === undefined) throw new WorkflowWorldError('wait_created needs a correlationId', { status: 400 });
        if (state.waits.has(cid)) throw new EntityConflictError(`Wait "${cid}" already exists`);
        return plain();
      case 'wait_completed': {
        const w = cid === undefined ? undefined : state.waits.get(cid);
        // A run's waits end with it, as the SDK's local world deletes them.
        if (w === undefined || TERMINAL_RUN.has(run?.status ?? '')) throw new WorkflowWorldError(`Wait "${cid}" not found`, { status: 404 });
        if (w.status === 'completed') throw new EntityConflictError(`Wait "${cid}" already completed`);
        return plain();
      }
      default:
        throw new WorkflowWorldError(`unknown event type ${JSON.stringify(eventType)}`, { status: 400 });
    }
  };
  return cache.transition<EventResult>(sdkRunId, async (state) => reportingSkipped(await decide(state), params));
}

/** An event of a run by its SDK id. */
export function findEvent(state: RunState, eventId: string): SdkEvent | undefined {
  return state.events.find((e) => e.eventId === eventId);
}

/**
 * `decision` with its results reporting, when the writer's `eventCount` was stale, the events it
 * had not seen: a stale count never refuses a write, which commits at the next free position, and
 * the events between the position asked for and the one taken come back in `events`.
 */
function reportingSkipped(decision: Decision<EventResult>, params: CreateParams | undefined): Decision<EventResult> {
  const seen = params?.eventCount;
  if (decision.kind !== 'append' || typeof seen !== 'number' || !Number.isSafeInteger(seen) || seen < 0) return decision;
  const report =
    (result: Commit<EventResult>['result']): Commit<EventResult>['result'] =>
    (events, state) => {
      const r = result(events, state) as EventResult & Data;
      // The position of the first event this write committed.
      const first = state.events.length - events.length + 1;
      if (r.events === undefined && first > seen + 1) {
        const skipped = state.events.slice(seen, first - 1).map((e) => strip(e, params?.resolveData));
        r.events = skipped;
        r.cursor = skipped[skipped.length - 1].eventId;
        r.hasMore = false;
      }
      return r;
    };
  const onIndexConflict = decision.onIndexConflict;
  return {
    ...decision,
    result: report(decision.result),
    onIndexConflict:
      onIndexConflict &&
      (async (holder) => {
        const other = await onIndexConflict(holder);
        return other && { ...other, result: report(other.result) };
      }),
  };
}

export type { SdkEvent };
