// The SDK's Storage over our logs: reads fold the run's log (kept folded per process); cross-run
// reads go through the indexes committed with the events.
import type { Hook, Step, Storage, WorkflowRun } from '@workflow/world';
import { HookNotFoundError, WorkflowRunNotFoundError, WorkflowWorldError } from './errors.js';
import { createEvent, createEventBatch } from './decide.js';
import { findEvent, INDEX, pageOf, RunCache, strip, type ResolveData, type RunState, type SdkEvent } from './runs.js';
import { logOfRun } from './ids.js';
import { allIndexEntries, indexText, listIndexEntries, lookupIndexEntry, subscribe, type World } from './store.js';

type Pagination = { limit?: number; cursor?: string; sortOrder?: 'asc' | 'desc' };

const TERMINAL_RUN = new Set(['completed', 'failed', 'cancelled']);
const TERMINAL_RUN_TYPES = new Set(['workflow.run_completed', 'workflow.run_failed', 'workflow.run_cancelled']);
/** The longest `runs.waitForTerminalStatus` holds a caller, whatever it asks for. */
const WAIT_MAX_MS = 60_000;

// Each entity is handed out as a copy (see `strip`): the run cache's own objects stay as stored.

function withoutRunData(run: WorkflowRun, resolveData: ResolveData | undefined): WorkflowRun {
  return structuredClone(resolveData === 'none' ? ({ ...run, input: undefined, output: undefined } as WorkflowRun) : run);
}

function withoutStepData(step: Step, resolveData: ResolveData | undefined): Step {
  return structuredClone(resolveData === 'none' ? { ...step, input: undefined, output: undefined } : step);
}

function withoutHookData(hook: Hook, resolveData: ResolveData | undefined): Hook {
  if (resolveData !== 'none') return structuredClone(hook);
  const { metadata: _metadata, ...rest } = hook;
  return structuredClone(rest) as Hook;
}

function limitOf(p: Pagination | undefined, dflt: number): number {
  const n = p?.limit ?? dflt;
  return Math.min(Math.max(Math.floor(n), 1), 1000);
}

/** The cursor a page starts after; an empty one (as the SDK's CLI sends for the first page) is none. */
function cursorOf(p: Pagination | undefined): string | undefined {
  return p?.cursor || undefined;
}

/** A page of `items` (sorted ascending by `id`) after a cursor (an id). */
function pageById<T>(items: T[], id: (t: T) => string, p: Pagination | undefined, dflt: 'asc' | 'desc') {
  const order = p?.sortOrder ?? dflt;
  const sorted = [...items].sort((a, b) => (id(a) < id(b) ? -1 : id(a) > id(b) ? 1 : 0));
  if (order === 'desc') sorted.reverse();
  const cursor = cursorOf(p);
  const rest = cursor === undefined ? sorted : sorted.filter((t) => (order === 'asc' ? id(t) > cursor : id(t) < cursor));
  const n = limitOf(p, 100);
  const data = rest.slice(0, n);
  const hasMore = rest.length > n;
  return { data, cursor: hasMore && data.length > 0 ? id(data[data.length - 1]) : null, hasMore };
}

export function createStorage(world: World, cache: RunCache): Storage {
  async function stateOf(sdkRunId: string): Promise<RunState & { run: WorkflowRun }> {
    const state = await cache.inTurn(sdkRunId, () => cache.refresh(sdkRunId));
    if (state.run === undefined) throw new WorkflowRunNotFoundError(sdkRunId);
    return state as RunState & { run: WorkflowRun };
  }

  /** The live hook with `hookId` found through the index, or undefined. */
  async function liveHook(hookId: string): Promise<Hook | undefined> {
    const entries = await listIndexEntries(world, INDEX.hook, { value: indexText(hookId), limit: 10 });
    for (const entry of entries) {
      const state = await stateOf(entry.runId.slice(4)).catch(() => undefined);
      const h = state?.hooks.get(hookId);
      if (h?.live) return h.hook;
    }
    return undefined;
  }

  /** The step with `stepId` in whichever run has it, found through the correlation index. */
  async function anyRunsStep(stepId: string): Promise<Step | undefined> {
    if (typeof stepId !== 'string' || stepId.length === 0) return undefined;
    const entries = await listIndexEntries(world, INDEX.correlation, { value: indexText(stepId), limit: 10 });
    for (const entry of entries) {
      const state = await stateOf(entry.runId.slice(4)).catch(() => undefined);
      const step = state?.steps.get(stepId);
      if (step !== undefined) return step;
    }
    return undefined;
  }

  const isNotFound = (err: unknown) => (err as { name?: unknown } | null)?.name === 'WorkflowRunNotFoundError';

  const runs = {
    async get(id: string, params?: { resolveData?: ResolveData }) {
      const state = await stateOf(id);
      return withoutRunData(state.run, params?.resolveData);
    },
    /** Several runs at once, in the order asked, null for one that does not exist. */
    async getMany(ids: readonly string[], params?: { resolveData?: ResolveData }) {
      return Promise.all(ids.map((id) => stateOf(id).then((state) => withoutRunData(state.run, params?.resolveData), (err: unknown) => (isNotFound(err) ? null : Promise.reject(err)))));
    },
    /**
     * The run once it is terminal, or as it is when `timeoutMs` (at most a minute) has passed or
     * `signal` aborted: the run's log is followed live, committed events of other processes too.
     */
    async waitForTerminalStatus(id: string, params?: { resolveData?: ResolveData; timeoutMs?: number; signal?: AbortSignal }) {
      const state = await stateOf(id);
      if (!TERMINAL_RUN.has(state.run.status)) {
        const ms = Math.min(Math.max(params?.timeoutMs ?? WAIT_MAX_MS, 0), WAIT_MAX_MS);
        const stop = new AbortController();
        const timer = setTimeout(() => stop.abort(), ms);
        const signal = params?.signal !== undefined ? AbortSignal.any([stop.signal, params.signal]) : stop.signal;
        try {
          for await (const env of subscribe(world, logOfRun(id), { afterSequence: state.lastSequence, signal })) {
            if (TERMINAL_RUN_TYPES.has(env.type)) break;
          }
        } finally {
          clearTimeout(timer);
          stop.abort();
        }
      }
      return runs.get(id, params);
    },
    async list(params?: { workflowName?: string; status?: string | string[]; pagination?: Pagination; resolveData?: ResolveData }) {
      const order = params?.pagination?.sortOrder ?? 'desc';
      const limit = limitOf(params?.pagination, 200);
      // A status may be one or a set of them; an empty set matches no run.
      const statuses = params?.status === undefined ? undefined : new Set(Array.isArray(params.status) ? params.status : [params.status]);
      if (statuses?.size === 0) return { data: [], cursor: null, hasMore: false };
      const oneStatus = statuses?.size === 1 ? [...statuses][0] : undefined;
      // One index answers the listing; the other filters are checked on the run.
      const byStatus = oneStatus !== undefined || params?.workflowName === undefined;
      const index = byStatus ? INDEX.runStatus : INDEX.runName;
      const value = byStatus ? oneStatus : indexText(params?.workflowName as string);
      const data: WorkflowRun[] = [];
      let after = cursorOf(params?.pagination);
      let hasMore = false;
      outer: for (;;) {
        const page = await listIndexEntries(world, index, { value, after, limit: limit + 1, order });
        for (const entry of page) {
          const state = await stateOf(entry.key).catch(() => undefined);
          after = entry.key;
          if (state === undefined) continue;
          if (params?.workflowName !== undefined && state.run.workflowName !== params.workflowName) continue;
          if (statuses !== undefined && !statuses.has(state.run.status)) continue;
          if (data.length === limit) {
            hasMore = true;
            break outer;
          }
          data.push(withoutRunData(state.run, params?.resolveData));
        }
        if (page.length < limit + 1) break;
      }
      return { data, cursor: hasMore && data.length > 0 ? data[data.length - 1].runId : null, hasMore };
    },
  };

  const steps = {
    /** A step of a run; with no run (as the 4.x line asks), the step with that id in any run. */
    async get(runId: string | undefined, stepId: string, params?: { resolveData?: ResolveData }) {
      const step = runId !== undefined ? (await stateOf(runId)).steps.get(stepId) : await anyRunsStep(stepId);
      if (step === undefined) throw new WorkflowWorldError(runId !== undefined ? `Step ${stepId} in run ${runId} not found` : `Step ${stepId} not found`, { status: 404 });
      return withoutStepData(step, params?.resolveData);
    },
    async list(params: { runId: string; pagination?: Pagination; resolveData?: ResolveData }) {
      const state = await stateOf(params.runId);
      const page = pageById([...state.steps.values()], (s) => s.stepId, params.pagination, 'desc');
      return { ...page, data: page.data.map((s) => withoutStepData(s, params.resolveData)) };
    },
  };

  const events = {
    create: (runId: string | null, data: unknown, params?: unknown) =>
      createEvent(cache, world, runId, data as Parameters<typeof createEvent>[3], params as Parameters<typeof createEvent>[4]),
    createBatch: (runId: string, items: unknown, params?: unknown) =>
      createEventBatch(cache, world, runId, items as Parameters<typeof createEventBatch>[3], params as Parameters<typeof createEventBatch>[4]),
    async get(runId: string, eventId: string, params?: { resolveData?: ResolveData }) {
      const state = await stateOf(runId);
      const e = findEvent(state, eventId);
      if (e === undefined) throw new WorkflowWorldError(`Event ${eventId} in run ${runId} not found`, { status: 404 });
      return strip(e, params?.resolveData);
    },
    async list(params: { runId: string; pagination?: Pagination; resolveData?: ResolveData }) {
      const state = await stateOf(params.runId);
      const p = params.pagination;
      return pageOf(state.events, cursorOf(p), p?.limit ?? 1000, p?.sortOrder ?? 'asc', params.resolveData);
    },
    /** The events with a correlation id: of the run named (a correlation id is unique per run), else of every run. */
    async listByCorrelationId(params: { correlationId: string; runId?: string; pagination?: Pagination; resolveData?: ResolveData }) {
      const cid = params.correlationId;
      const found: SdkEvent[] = [];
      const runIds = params.runId !== undefined ? [params.runId] : (await allIndexEntries(world, INDEX.correlation, indexText(cid))).map((entry) => entry.runId.slice(4));
      for (const runId of runIds) {
        const state = await stateOf(runId).catch(() => undefined);
        if (state !== undefined) for (const e of state.events) if (e.correlationId === cid) found.push(e);
      }
      // Across runs: by time, then by run and position.
      found.sort((a, b) => a.createdAt.getTime() - b.createdAt.getTime() || (a.runId < b.runId ? -1 : a.runId > b.runId ? 1 : a.eventId < b.eventId ? -1 : 1));
      const p = params.pagination;
      const order = p?.sortOrder ?? 'asc';
      const all = order === 'asc' ? found : found.reverse();
      const start = Number(cursorOf(p) ?? 0) || 0;
      const n = limitOf(p, 100);
      const data = all.slice(start, start + n).map((e) => strip(e, params.resolveData));
      const hasMore = start + n < all.length;
      return { data, cursor: hasMore ? String(start + n) : null, hasMore };
    },
  };

  const hooks = {
    async get(hookId: string, params?: { resolveData?: ResolveData }) {
      const hook = await liveHook(hookId);
      if (hook === undefined) throw new HookNotFoundError(hookId);
      return withoutHookData(hook, params?.resolveData);
    },
    async getByToken(token: string, params?: { resolveData?: ResolveData }) {
      const entry = typeof token === 'string' && token.length > 0 ? await lookupIndexEntry(world, INDEX.hookToken, indexText(token)) : undefined;
      if (entry !== undefined && entry.runId.startsWith('run_')) {
        const state = await stateOf(entry.runId.slice(4)).catch(() => undefined);
        for (const h of state?.hooks.values() ?? []) {
          if (h.live && h.hook.token === token) return withoutHookData(h.hook, params?.resolveData);
        }
      }
      throw new HookNotFoundError(token);
    },
    async list(params: { runId?: string; pagination?: Pagination; resolveData?: ResolveData }) {
      let found: Hook[];
      if (params.runId !== undefined) {
        const state = await stateOf(params.runId);
        found = [...state.hooks.values()].filter((h) => h.live).map((h) => h.hook);
      } else {
        found = [];
        for (const entry of await allIndexEntries(world, INDEX.hookToken)) {
          if (!entry.runId.startsWith('run_')) continue;
          const state = await stateOf(entry.runId.slice(4)).catch(() => undefined);
          for (const h of state?.hooks.values() ?? []) if (h.live && indexText(h.hook.token) === entry.key) found.push(h.hook);
        }
      }
      const page = pageById(found, (h) => h.hookId, params.pagination, 'asc');
      return { ...page, data: page.data.map((h) => withoutHookData(h, params.resolveData)) };
    },
  };

  return { runs, steps, events, hooks } as unknown as Storage;
}
