// Inspection (what `little` uses): verifying a world, and listing its runs.
import { call, checkRunIdType, invalid } from './errors.js';
import { frozen, options } from './json.js';
import { nativeOf, type World } from './worlds.js';

/** One thing `verifyWorld` found wrong. */
export type VerifyProblem = {
  /**
   * `hole`, `not-canonical`, `row-mismatch`, `event-id`, `unreadable`, `run-event-body` (of an
   * event); `fold-snapshot` (a run's kept fold snapshot that is not the fold of its events);
   * `catalog` (a runs-catalog row that disagrees with its run's events);
   * `missing-artifact`, `artifact-hash`, `artifact-manifest`, `artifact-integrity`,
   * `artifact-unreadable` (of an artifact the system would not let be read; its message says why).
   */
  readonly kind: string;
  readonly runId?: string;
  readonly sequence?: number;
  readonly artifactId?: string;
  readonly message: string;
};

/** What `verifyWorld` checked and found. */
export type VerifyReport = {
  readonly ok: boolean;
  readonly runs: number;
  readonly events: number;
  readonly artifacts: number;
  readonly problems: readonly VerifyProblem[];
};

/** Options of {@link verifyWorld}. */
export interface VerifyOptions {
  /**
   * Run the store's thorough check (SQLite's `integrity_check`, which also compares every index
   * with its table) instead of its fast one (`quick_check`). Default false.
   */
  thorough?: boolean;
}

/**
 * Re-check a run (or, without `runId`, every run and every artifact): the store's own check of
 * its files, dense sequences, canonical stored envelopes, event ids, rows that agree with their
 * envelopes, referenced artifacts present, artifact hashes and sizes. Resolves with every problem
 * found; it does not throw for them.
 */
export async function verifyWorld(world: World, runId?: string, opts?: VerifyOptions): Promise<VerifyReport> {
  const handle = nativeOf(world);
  if (runId !== undefined) checkRunIdType(runId);
  const o = options(opts, 'verifyWorld options', ['thorough']);
  if (o.thorough !== undefined && typeof o.thorough !== 'boolean') invalid('thorough', 'must be a boolean');
  return frozen<VerifyReport>(await call(() => handle.verify(runId, o.thorough)));
}

/** A run (or session) stored in a world. */
export type RunSummary = {
  readonly runId: string;
  readonly eventCount: number;
  readonly lastSequence: number;
  readonly firstRecordedAt: string;
  readonly lastRecordedAt: string;
  readonly status: string;
  readonly costUsd: number | null;
};

/** Options of {@link queryRuns}. */
export interface QueryRunsOptions {
  /** Only runs in one of these statuses (`['completed', 'failed']`). */
  status?: readonly string[];
  /** Only runs whose last event was recorded before this time. */
  lastRecordedBefore?: string | Date;
  /** Only runs whose last event was recorded at or after this time. */
  lastRecordedAfter?: string | Date;
  /** `'newest'` (by last `recordedAt`, then id, latest first; the default), `'oldest'` or `'id'`. */
  order?: 'newest' | 'oldest' | 'id';
  /** Runs per page: 1 to 10,000, default 100. */
  limit?: number;
  /** Where the page starts: the `cursor` of the page before (with the same order). */
  cursor?: string;
}

/** A page of runs, and the cursor of the next page (`null` after the last). */
export type RunPage = { readonly runs: readonly RunSummary[]; readonly cursor: string | null };

/** A time a caller gives (an ISO string or a `Date`), as the ISO string the core compares. */
export function isoTime(name: string, v: unknown): string {
  if (Object.prototype.toString.call(v) === '[object Date]') {
    const t = Date.prototype.getTime.call(v);
    if (Number.isNaN(t)) invalid(name, 'is an invalid Date');
    return new Date(t).toISOString();
  }
  if (typeof v !== 'string' || !/^\d{4}-\d{2}-\d{2}T/.test(v) || Number.isNaN(Date.parse(v))) {
    invalid(name, 'must be an ISO time such as 2026-01-31T12:00:00.000Z, or a Date');
  }
  return new Date(Date.parse(v)).toISOString();
}

/** A list of run statuses a caller gives, checked and copied. */
export function statusList(name: string, v: unknown): string[] {
  if (!Array.isArray(v) || v.length === 0 || !v.every((s) => typeof s === 'string' && s.length > 0)) {
    invalid(name, 'must be a non-empty array of status names');
  }
  return [...(v as string[])];
}

/**
 * A page of the world's runs from its runs catalog, newest first by default: a page costs what
 * its runs cost, however many runs the world holds. Pass the returned `cursor` to get the next.
 */
export async function queryRuns(world: World, opts?: QueryRunsOptions): Promise<RunPage> {
  const handle = nativeOf(world);
  const o = options(opts, 'queryRuns options', ['status', 'lastRecordedBefore', 'lastRecordedAfter', 'order', 'limit', 'cursor']);
  const request: Record<string, unknown> = {};
  if (o.status !== undefined) request.status = statusList('status', o.status);
  if (o.lastRecordedBefore !== undefined) request.lastRecordedBefore = isoTime('lastRecordedBefore', o.lastRecordedBefore);
  if (o.lastRecordedAfter !== undefined) request.lastRecordedAfter = isoTime('lastRecordedAfter', o.lastRecordedAfter);
  if (o.order !== undefined) {
    if (o.order !== 'newest' && o.order !== 'oldest' && o.order !== 'id') invalid('order', "must be 'newest', 'oldest' or 'id'");
    request.order = o.order;
  }
  if (o.limit !== undefined) {
    if (typeof o.limit !== 'number' || !Number.isInteger(o.limit) || o.limit < 1 || o.limit > 10_000) {
      invalid('limit', 'must be an integer from 1 to 10000');
    }
    request.limit = o.limit;
  }
  if (o.cursor !== undefined) {
    if (typeof o.cursor !== 'string') invalid('cursor', 'must be a string from an earlier page');
    request.cursor = o.cursor;
  }
  const text = JSON.stringify(request);
  return frozen<RunPage>(await call(() => handle.queryRuns(text)));
}

/** Every run stored in the world, ordered by id. */
export async function listRuns(world: World): Promise<readonly RunSummary[]> {
  const handle = nativeOf(world);
  return frozen<RunSummary[]>(await call(() => handle.runs()));
}
