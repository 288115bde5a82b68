// `events.create` and `events.createBatch`: each SDK event checked against the state its run's log
// folds to, the way the SDK's own worlds check it, and turned into the envelopes to append. An
// event that creates an entity on the way (a `run_started` carrying its run's input, a lazy
// `step_started` carrying its step's) is two SDK events, and so two envelopes, committed together.
import type { EventResult } from '@workflow/world';
import { EntityConflictError, HookNotFoundError, RunExpiredError, RunNotSupportedError, TooEarlyError, WorkflowRunNotFoundError, WorkflowWorldError } from './errors.js';
import { ulid } from './ids.js';
import type { SdkLine } from './line.js';
import {
  apply,
  CHILD_CREATIONS,
  copyState,
  INDEX,
  pageOf,
  payloadOf,
  resultOf,
  sdkEvent,
  strip,
  TERMINAL_RUN,
  TERMINAL_RUN_EVENTS,
  TERMINAL_STEP,
  TYPE_PREFIX,
  type Append,
  type Commit,
  type CreateParams,
  type Decision,
  type EventRequest,
  type RunCache,
  type RunState,
  type SdkEvent,
} from './runs.js';
import { indexText, type IndexWrite, type World } from './store.js';

type Data = Record<string, unknown>;
type Appending = Extract<Decision<EventResult>, { kind: 'append' }>;

/** What deciding one event needs: the run, the event as the writer sent it, and its parameters. */
type Ask = {
  world: World;
  line: SdkLine;
  sdkRunId: string;
  req: EventRequest & { specVersion: number };
  params?: CreateParams;
};

/** `events.create`: check the event against the run's state and append it. */
export async function createEvent(cache: RunCache, world: World, runIdArg: string | null, data: EventRequest, params?: CreateParams): Promise<EventResult> {
  const ask = askOf(cache, world, runOf(data.eventType, runIdArg), data, params);
  return cache.transition<EventResult>(ask.sdkRunId, async (state) => reportingSkipped(await decide(ask, state), params));
}

/** The SDK run an event is for: the one named, or a new one for a `run_created` naming none. */
function runOf(eventType: string, runIdArg: string | null): string {
  let sdkRunId: string;
  if (eventType === 'run_created') sdkRunId = runIdArg || `wrun_${ulid()}`;
  else if (!runIdArg) throw new WorkflowWorldError('runId is required for non-run_created events', { status: 400 });
  else sdkRunId = runIdArg;
  if (!/^[A-Za-z0-9_-]{1,76}$/.test(sdkRunId)) throw new WorkflowWorldError(`invalid runId ${JSON.stringify(sdkRunId)}`, { status: 400 });
  return sdkRunId;
}

function askOf(cache: RunCache, world: World, sdkRunId: string, data: EventRequest, params: CreateParams | undefined): Ask {
  const cid = data.correlationId;
  if (cid !== undefined && (typeof cid !== 'string' || cid.length === 0)) {
    throw new WorkflowWorldError(`invalid correlationId ${JSON.stringify(cid)}`, { status: 400 });
  }
  const line = cache.line;
  return { world, line, sdkRunId, req: { ...data, specVersion: data.specVersion ?? line.minted() }, params };
}

/** What to append for the event `ask` holds, or its answer when nothing needs appending. */
async function decide(ask: Ask, state: RunState): Promise<Decision<EventResult>> {
  const { req } = ask;
  const eventType = req.eventType;
  if (eventType === 'run_created') return decideRunCreated(ask, state);
  const d = req.eventData ?? {};
  const run = state.run;
  // Resilient start: a run_started carrying the run's input creates the run it starts.
  const creating = eventType === 'run_started' && run === undefined && typeof d.deploymentId === 'string' && typeof d.workflowName === 'string' && d.input !== undefined;
  if (run === undefined && !creating) throw new WorkflowRunNotFoundError(ask.sdkRunId);
  if (run !== undefined && typeof run.specVersion === 'number' && run.specVersion > ask.line.maxReadable) throw new RunNotSupportedError(run.specVersion, ask.line.maxReadable);
  const terminal = checkTerminalRun(ask, state);
  if (terminal !== undefined) return terminal;
  switch (eventType) {
    case 'run_started':
      return decideRunStarted(ask, state, creating);
    case 'run_completed':
    case 'run_failed':
    case 'run_cancelled':
      return plain(ask, state, statusIndex(ask.sdkRunId, state, eventType.slice('run_'.length)));
    case 'attr_set':
      return decideAttributes(ask, state);
    case 'step_created':
    case 'step_started':
    case 'step_completed':
    case 'step_failed':
    case 'step_retrying':
      return decideStepEvent(ask, state);
    case 'hook_created':
      return decideHookCreated(ask, state);
    case 'hook_received':
    case 'hook_disposed':
      return decideHookUse(ask, state);
    case 'wait_created':
    case 'wait_completed':
      return decideWaitEvent(ask, state);
    default:
      throw new WorkflowWorldError(`unknown event type ${JSON.stringify(eventType)}`, { status: 400 });
  }
}

/** The envelope of the event as sent, with `index` and the correlation id's entry. */
async function appendOf(ask: Ask, state: RunState, index: IndexWrite[] = [], req: EventRequest = ask.req): Promise<Append> {
  return {
    type: `${TYPE_PREFIX}${req.eventType}`,
    payload: await payloadOf(ask.world, ask.sdkRunId, req),
    index: [...index, ...correlationIndex(ask.sdkRunId, state, req.correlationId)],
  };
}

/** The event appended as sent, answered with the entities it changed. */
async function plain(ask: Ask, state: RunState, index: IndexWrite[] = []): Promise<Appending> {
  return { kind: 'append', appends: [await appendOf(ask, state, index)], result: (events, s) => resultOf(s, events[events.length - 1], ask.params) };
}

/** `result` with, when the writer passed `sinceCursor`, the events after it (the inline delta). */
function withDelta(ask: Ask, result: Commit<EventResult>['result']): Commit<EventResult>['result'] {
  return (events, s) => {
    const r = result(events, s) as EventResult & Data;
    if (typeof ask.params?.sinceCursor === 'string') {
      const page = pageOf(s.events, ask.params.sinceCursor, 1000, 'asc', ask.params.resolveData);
      r.events = page.data;
      r.cursor = page.cursor;
      r.hasMore = page.hasMore;
    }
    return r;
  };
}

async function decideRunCreated(ask: Ask, state: RunState): Promise<Appending> {
  if (state.run !== undefined || state.lastSequence > 0) throw new EntityConflictError(`Workflow run "${ask.sdkRunId}" already exists`);
  const d = ask.req.eventData ?? {};
  checkAttributes(ask.line, Object.entries((d.attributes as Data | undefined) ?? {}).map(([key, value]) => ({ key, value })), d.allowReservedAttributes === true);
  return plain(ask, state, [
    { index: INDEX.runStatus, key: ask.sdkRunId, value: 'pending' },
    { index: INDEX.runName, key: ask.sdkRunId, value: indexText(String(d.workflowName)) },
  ]);
}

/** Whether the event is a lazy `step_started`: one carrying its step's name and input, which creates the step it starts. */
function isLazyStep(req: EventRequest): boolean {
  const d = req.eventData ?? {};
  return req.eventType === 'step_started' && typeof d.stepName === 'string' && d.input !== undefined;
}

/** What an event may not do to a run that has ended; `plain` for a cancel repeated. */
function checkTerminalRun(ask: Ask, state: RunState): Promise<Appending> | undefined {
  const status = state.run?.status;
  if (status === undefined || !TERMINAL_RUN.has(status)) return undefined;
  const eventType = ask.req.eventType;
  if (eventType === 'run_cancelled' && status === 'cancelled') return plain(ask, state);
  if (eventType === 'run_started') throw new RunExpiredError(`Workflow run "${ask.sdkRunId}" is already in terminal state "${status}"`);
  if (TERMINAL_RUN_EVENTS.has(eventType)) throw new EntityConflictError(`Cannot transition run from terminal state "${status}"`);
  if (CHILD_CREATIONS.has(eventType) || isLazyStep(ask.req)) throw new EntityConflictError(`Cannot create new entities on run in terminal state "${status}"`);
  if (eventType === 'attr_set') throw new EntityConflictError(`Cannot set attributes on run in terminal state "${status}"`);
  return undefined;
}

async function decideRunStarted(ask: Ask, state: RunState, creating: boolean): Promise<Decision<EventResult>> {
  const run = state.run;
  if (run?.status === 'running') return { kind: 'done', value: { run: structuredClone(run) } as EventResult };
  const { sdkRunId, req, params } = ask;
  const d = req.eventData ?? {};
  const appends: Append[] = [];
  let index = statusIndex(sdkRunId, state, 'running');
  if (creating) {
    // The run_created this start stands for, as its own event before it.
    const created: EventRequest = {
      eventType: 'run_created',
      specVersion: req.specVersion,
      eventData: {
        deploymentId: d.deploymentId,
        workflowName: d.workflowName,
        input: d.input,
        executionContext: d.executionContext,
        attributes: d.attributes,
        allowReservedAttributes: d.allowReservedAttributes,
      },
    };
    const decided = await decideRunCreated({ ...ask, req: { ...created, specVersion: req.specVersion } }, state);
    appends.push(...decided.appends);
    index = [{ index: INDEX.runStatus, key: sdkRunId, value: 'running' }];
  }
  // The run's input belongs on run_created only.
  appends.push(await appendOf(ask, state, index, { eventType: req.eventType, specVersion: req.specVersion, correlationId: req.correlationId }));
  return {
    kind: 'append',
    appends,
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

async function decideAttributes(ask: Ask, state: RunState): Promise<Appending> {
  const d = ask.req.eventData ?? {};
  const cid = ask.req.correlationId;
  checkAttributes(ask.line, (d.changes as { key: string; value: unknown }[] | undefined) ?? [], d.allowReservedAttributes === true, Object.keys(state.run?.attributes ?? {}));
  if (cid !== undefined && (d.writer as Data | undefined)?.type === 'workflow' && state.attrEvents.has(cid)) {
    throw new EntityConflictError(`Attribute event "${cid}" already exists`);
  }
  return plain(ask, state);
}

async function decideStepEvent(ask: Ask, state: RunState): Promise<Appending> {
  const { req } = ask;
  const eventType = req.eventType;
  const cid = req.correlationId;
  const d = req.eventData ?? {};
  if (cid === undefined) throw new WorkflowWorldError(`${eventType} needs a correlationId`, { status: 400 });
  const step = state.steps.get(cid);
  if (eventType === 'step_created') {
    if (step !== undefined) throw new EntityConflictError(`Step "${cid}" already created`);
    return plain(ask, state);
  }
  const lazyStep = isLazyStep(req);
  if (step === undefined && !lazyStep) throw new WorkflowWorldError(`Step "${cid}" not found`, { status: 404 });
  if (lazyStep && step !== undefined) throw new EntityConflictError(`Step "${cid}" already created`);
  const status = state.run?.status;
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
      // The step is created by this event: its step_created first, as an event of its own.
      const { input, stepName, ...rest } = d;
      const created = await appendOf(ask, state, [], { eventType: 'step_created', correlationId: cid, specVersion: req.specVersion, eventData: { stepName, input } });
      const started: Append = { type: `${TYPE_PREFIX}${eventType}`, payload: await payloadOf(ask.world, ask.sdkRunId, { ...req, eventData: rest }) };
      return {
        kind: 'append',
        appends: [created, started],
        result: (events, s) => ({ ...resultOf(s, events[events.length - 1], ask.params), stepCreated: true }) as EventResult,
      };
    }
  }
  const decided = await plain(ask, state);
  if (eventType === 'step_completed' || eventType === 'step_failed') return { ...decided, result: withDelta(ask, decided.result) };
  return decided;
}

async function decideHookCreated(ask: Ask, state: RunState): Promise<Appending> {
  const { sdkRunId, req, params } = ask;
  const cid = req.correlationId;
  if (cid === undefined) throw new WorkflowWorldError('hook_created needs a correlationId', { status: 400 });
  if (state.hooks.has(cid)) throw new EntityConflictError(`Hook "${cid}" already created`);
  const token = req.eventData?.token;
  if (typeof token !== 'string' || token.length === 0) {
    throw new WorkflowWorldError('hook_created needs a token: a non-empty string', { status: 400 });
  }
  /** A hook_conflict instead: the token is taken, by this run or `holderRunId`. */
  const conflict = async (holderRunId: string | undefined): Promise<Commit<EventResult>> => ({
    appends: [
      await appendOf(ask, state, [], {
        eventType: 'hook_conflict',
        correlationId: cid,
        specVersion: req.specVersion,
        eventData: { token, ...(holderRunId !== undefined ? { conflictingRunId: holderRunId } : {}) },
      }),
    ],
    // The delta is answered on the conflict too: it settles the same awaiter.
    result: withDelta(ask, (events) => ({ event: strip(events[events.length - 1], params?.resolveData), hook: undefined }) as EventResult),
  });
  // A live hook of this run with the token: the run holds the index entry already.
  for (const h of state.hooks.values()) {
    if (h.live && h.hook.token === token) return { kind: 'append', ...(await conflict(sdkRunId)) };
  }
  const claim = await plain(ask, state, [
    { index: INDEX.hookToken, key: indexText(token), value: indexText(cid) },
    { index: INDEX.hook, key: `${sdkRunId}\n${indexText(cid)}`, value: indexText(cid) },
  ]);
  return {
    ...claim,
    result: withDelta(ask, claim.result),
    onIndexConflict: async (holder) => conflict(holder?.startsWith('run_') ? holder.slice(4) : holder),
  };
}

async function decideHookUse(ask: Ask, state: RunState): Promise<Decision<EventResult>> {
  const { req, params } = ask;
  const eventType = req.eventType;
  const cid = req.correlationId;
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
  if (eventType === 'hook_disposed') return plain(ask, state, [{ index: INDEX.hookToken, key: indexText(h.hook.token), value: null }]);
  if (resumeId === undefined) return plain(ask, state);
  return plain({ ...ask, req: { ...req, resumeId, resumePayloadDigest: digest } }, state);
}

async function decideWaitEvent(ask: Ask, state: RunState): Promise<Appending> {
  const { eventType, correlationId: cid } = ask.req;
  if (cid === undefined) throw new WorkflowWorldError(`${eventType} needs a correlationId`, { status: 400 });
  const w = state.waits.get(cid);
  if (eventType === 'wait_created') {
    if (w !== undefined) throw new EntityConflictError(`Wait "${cid}" already exists`);
    return plain(ask, state);
  }
  // A run's waits end with it, as the SDK's local world deletes them.
  if (w === undefined || TERMINAL_RUN.has(state.run?.status ?? '')) throw new WorkflowWorldError(`Wait "${cid}" not found`, { status: 404 });
  if (w.status === 'completed') throw new EntityConflictError(`Wait "${cid}" already completed`);
  return plain(ask, state);
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

/** Event types a batch may not hold: the SDK's interface leaves them to the single `create`. */
const NOT_IN_BATCH = new Set(['run_created', 'run_started', 'run_cancelled', 'hook_created', 'hook_disposed', 'attr_set']);

/** Most events in one `createBatch`. */
const MAX_BATCH = 1000;

type BatchItem = { event: EventRequest; occurredAt?: Date; computeInstanceId?: string };
type BatchResult = { status: number; error?: string; message?: string; event?: unknown; run?: unknown; step?: unknown; wait?: unknown };

/**
 * `events.createBatch`: each event decided as its own `create` would be, in order, against the
 * state the events before it leave; those accepted commit together in one transaction (all or
 * none of them), at consecutive positions. Each event gets the outcome its own `create` would
 * have had: the event and its entities, or the status and error it would have failed with.
 */
export async function createEventBatch(cache: RunCache, world: World, runId: string, items: BatchItem[], params?: { resolveData?: CreateParams['resolveData'] }): Promise<{ results: BatchResult[] }> {
  const sdkRunId = runOf('', runId);
  checkBatch(items);
  const asks = items.map((item) => askOf(cache, world, sdkRunId, item.event, { resolveData: params?.resolveData }));
  return cache.transition(sdkRunId, async (state) => {
    // A copy to fold the accepted events into as they are decided.
    const ahead = copyState(state);
    const decided: Array<{ appends: Append[] } | { value: EventResult } | { failed: BatchResult }> = [];
    for (const ask of asks) {
      try {
        const d = await decide(ask, ahead);
        if (d.kind === 'done') {
          decided.push({ value: d.value });
          continue;
        }
        decided.push({ appends: d.appends });
        for (const a of d.appends) apply(ahead, sdkEvent(sdkRunId, 0, 0, a.type.slice(TYPE_PREFIX.length), a.payload, new Date()));
      } catch (err) {
        decided.push({ failed: failureOf(err) });
      }
    }
    const appends = decided.flatMap((d) => ('appends' in d ? d.appends : []));
    // Each accepted event's outcome: the last SDK event its envelopes hold, and its entities.
    const results = (events: SdkEvent[], s: RunState) => {
      let at = 0;
      return {
        results: decided.map((d): BatchResult => {
          if ('failed' in d) return d.failed;
          if ('value' in d) return { status: 200, ...d.value };
          at += d.appends.length;
          return { status: 200, ...resultOf(s, events[at - 1], params) };
        }),
      };
    };
    if (appends.length === 0) return { kind: 'done', value: results([], state) };
    return { kind: 'append', appends, result: results };
  });
}

/**
 * Refuse, as the SDK's interface says, a batch of a type left to the single `create`, or with
 * more events on one entity than one write can express: the one pair allowed is a
 * `step_started` without an input right after its step's `step_created`.
 */
function checkBatch(items: BatchItem[]): void {
  if (!Array.isArray(items) || items.length === 0 || items.length > MAX_BATCH) {
    throw new WorkflowWorldError(`createBatch needs 1 to ${MAX_BATCH} events`, { status: 400 });
  }
  const seen = new Set<string>();
  items.forEach((item, i) => {
    const e = item?.event;
    if (e === undefined || typeof e.eventType !== 'string') throw new WorkflowWorldError(`createBatch: events[${i}] has no event`, { status: 400 });
    if (NOT_IN_BATCH.has(e.eventType)) throw new WorkflowWorldError(`createBatch: ${e.eventType} cannot be batched; send it through create`, { status: 400 });
    const cid = e.correlationId;
    if (cid === undefined) return;
    const pairs = e.eventType === 'step_started' && items[i - 1]?.event?.eventType === 'step_created' && items[i - 1].event.correlationId === cid;
    if (pairs && e.eventData?.input !== undefined) {
      throw new WorkflowWorldError(`createBatch: the step_started of step "${cid}" carries an input; it belongs on its step_created`, { status: 400 });
    }
    if (seen.has(cid) && !pairs) throw new WorkflowWorldError(`createBatch: more than one event for "${cid}"`, { status: 400 });
    seen.add(cid);
  });
}

/** The outcome `err` gives an event of a batch: the status and error its own `create` would have had. */
function failureOf(err: unknown): BatchResult {
  const e = err as { status?: number; name?: string; code?: string; message?: string };
  if (!(err instanceof Error) || (typeof e.status !== 'number' && e.name !== 'WorkflowRunNotFoundError' && e.name !== 'HookNotFoundError')) throw err;
  const status = typeof e.status === 'number' ? e.status : 404;
  return { status, error: e.code ?? e.name ?? 'Error', message: e.message ?? String(err) };
}
