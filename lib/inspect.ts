// Inspection (what `little` uses): verifying a world, and listing its runs.
import { call, checkRunIdType, invalid } from './errors.js';
import { frozen, options } from './json.js';
import { nativeOf, type World } from './worlds.js';

/** One thing `verifyWorld` found wrong. */
export type VerifyProblem = {
  /**
   * `hole`, `not-canonical`, `row-mismatch`, `event-id`, `unreadable`, `run-event-body` (of an
   * event); `fold-snapshot` (a run's kept fold snapshot that is not the fold of its events);
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

/** Every run stored in the world, ordered by id. */
export async function listRuns(world: World): Promise<readonly RunSummary[]> {
  const handle = nativeOf(world);
  return frozen<RunSummary[]>(await call(() => handle.runs()));
}
