// Operating a world over time: deleting a run, pruning the runs that ended, giving freed space
// back, backing up a local world while it is written, and carrying runs between worlds as an
// archive. The rules are the core's.
import { types } from 'node:util';
import { call, callSync, checkRunIdType, invalid } from './errors.js';
import { isoTime, statusList } from './inspect.js';
import { frozen, options } from './json.js';
import type { RunLock } from './locks.js';
import { nativeOf, wakeSubscribers, type World } from './worlds.js';

/** What {@link deleteRun} removed. */
export type DeletedRun = {
  readonly runId: string;
  /** False when the world held nothing of the run. */
  readonly deleted: boolean;
  readonly events: number;
  readonly artifacts: number;
  /** Bytes of the artifacts removed. */
  readonly bytes: number;
};

/**
 * Delete a run (or session) and everything it owns: its events, the index entries it holds, its
 * catalog row and fold snapshots, and the artifacts it made that no remaining run refers to. All
 * or nothing for every reader, and through a crash. Rejects with `RunLockedError` while another
 * owner holds the run's lock; the holder passes its lock as `opts.lock`. A later append under the
 * same id starts a new run at sequence 1; the deleted run's idempotency keys go with it.
 */
export async function deleteRun(world: World, runId: string, opts?: { lock?: RunLock }): Promise<DeletedRun> {
  const handle = nativeOf(world);
  checkRunIdType(runId);
  const o = options(opts, 'deleteRun options', ['lock']);
  let token: string | undefined;
  if (o.lock !== undefined) {
    const lock = o.lock as Partial<RunLock> | null;
    if (lock === null || typeof lock !== 'object' || typeof lock.token !== 'string' || typeof lock.name !== 'string') {
      invalid('lock', 'must be a lock from acquireRunLock');
    }
    if (lock.name !== `run:${runId}`) invalid('lock', `is the lock ${JSON.stringify(lock.name)}, not the lock of ${runId}`);
    token = lock.token;
  }
  const deleted = frozen<DeletedRun>(await call(() => handle.deleteRun(runId, token)));
  // Its subscribers here find it gone and end (other processes' find out at their next look).
  wakeSubscribers(world, runId);
  return deleted;
}

/** Options of {@link pruneRuns}. */
export interface PruneRunsOptions {
  /** Required: only runs whose last event was recorded before this time are deleted. */
  endedBefore: string | Date;
  /** Default: every status in which a run has ended (`completed`, `failed`, `cancelled`, `timed_out`). */
  statuses?: readonly string[];
  /** Delete nothing; report the runs that would be deleted in `runIds`. */
  dryRun?: boolean;
  /** At most this many runs. */
  limit?: number;
}

/** What {@link pruneRuns} removed (or, in a dry run, would remove). */
export type PrunedRuns = {
  readonly runs: number;
  readonly events: number;
  readonly artifacts: number;
  readonly bytes: number;
  /** Runs left because another owner held their locks (a later prune deletes them). */
  readonly skipped: number;
  /** In a dry run: the runs that would be deleted, oldest first. */
  readonly runIds?: readonly string[];
};

/**
 * Delete, as {@link deleteRun} does, the runs that have ended (a terminal status in their
 * vocabulary) and whose last event was recorded before `endedBefore`, in small batches so that
 * appends to other runs keep flowing. A running, pending or paused run is never deleted, however
 * old; nor is one whose lock another owner holds. Run again after an interruption, it finishes.
 */
export async function pruneRuns(world: World, opts: PruneRunsOptions): Promise<PrunedRuns> {
  const handle = nativeOf(world);
  if (opts === undefined) invalid('endedBefore', 'is required: pruneRuns deletes only the runs that ended before it');
  const o = options(opts, 'pruneRuns options', ['endedBefore', 'statuses', 'dryRun', 'limit']);
  if (o.endedBefore === undefined) invalid('endedBefore', 'is required: pruneRuns deletes only the runs that ended before it');
  const request: Record<string, unknown> = { endedBefore: isoTime('endedBefore', o.endedBefore) };
  if (o.statuses !== undefined) request.statuses = statusList('statuses', o.statuses);
  if (o.dryRun !== undefined) {
    if (typeof o.dryRun !== 'boolean') invalid('dryRun', 'must be a boolean');
    request.dryRun = o.dryRun;
  }
  if (o.limit !== undefined) {
    if (typeof o.limit !== 'number' || !Number.isSafeInteger(o.limit) || o.limit < 1) invalid('limit', 'must be a positive integer');
    request.limit = o.limit;
  }
  const text = JSON.stringify(request);
  const pruned = frozen<PrunedRuns>(await call(() => handle.pruneRuns(text)));
  if (pruned.runs > 0 && request.dryRun !== true) wakeSubscribers(world);
  return pruned;
}

/** What {@link moveArtifactsToBucket} moved. */
export interface MovedArtifacts {
  moved: number;
  bytes: number;
  /** Artifacts still to move: 0 once every one is in the bucket. */
  left: number;
}

/**
 * Move up to `limit` (default 100) of the artifacts a world stored before it was opened with
 * `artifacts.s3` into the bucket: each verified, its object written, then its manifest, then
 * removed from where it was, so that a move cut short anywhere leaves it readable and moving again
 * finishes it. Call again until `left` is 0. A world without a bucket has nothing to move.
 */
export async function moveArtifactsToBucket(world: World, opts?: { limit?: number }): Promise<MovedArtifacts> {
  const handle = nativeOf(world);
  const { limit } = options(opts, 'moveArtifactsToBucket options', ['limit']);
  if (limit !== undefined && (typeof limit !== 'number' || !Number.isSafeInteger(limit) || limit < 1 || limit > 10_000)) {
    invalid('limit', 'must be an integer from 1 to 10,000');
  }
  return JSON.parse(await call(() => handle.moveArtifacts(limit ?? 100))) as MovedArtifacts;
}

/**
 * Give the space that deleted runs freed back to the operating system. A local world is
 * rewritten without its free pages (`VACUUM`), and its writers wait meanwhile; a PostgreSQL world
 * vacuums its tables, and its writers do not wait; a virtual world has nothing to do.
 */
export async function compactWorld(world: World): Promise<void> {
  const handle = nativeOf(world);
  await call(() => handle.compact());
}

/**
 * Copy a local world into `dir` (new, or empty) while it is written: the event store as of one
 * commit, then the artifacts and outer-loop manifests. The copy opens as a world. A PostgreSQL
 * world is backed up with `pg_dump` (or `little export`); a virtual world has nothing on disk.
 */
export async function backupWorld(world: World, dir: string): Promise<void> {
  const handle = nativeOf(world);
  if (typeof dir !== 'string' || dir.length === 0) invalid('dir', 'must be a directory path');
  await call(() => handle.backup(dir));
}

/** Which runs {@link exportRuns} writes; every run when none of these is given. */
export interface ExportRunsOptions {
  /** These runs (or sessions), in this order. Not with `status` or `endedBefore`. */
  runIds?: readonly string[];
  /** The runs of these statuses. */
  status?: readonly string[];
  /** The runs that ended (a terminal status, or one of `status`) before this time. */
  endedBefore?: string | Date;
}

/** What {@link importRuns} changed. */
export type ImportedRuns = {
  /** Runs that gained events: new ones, and ones the world held a prefix of. */
  readonly runs: number;
  readonly events: number;
  /** Artifacts published (one the world held already is not counted). */
  readonly artifacts: number;
  /** Runs the world held whole already, left as they were. */
  readonly unchanged: number;
};

/**
 * The archive of a world's runs, streamed: JSON Lines, each run's envelopes exactly as stored,
 * its index entries and its artifacts (format: docs/archive.md). Each iteration writes a new
 * archive, a piece of about 1 MiB at a time, so memory stays small whatever the world holds. An
 * export reads committed runs as they stand when it reaches each one.
 */
export function exportRuns(world: World, opts?: ExportRunsOptions): AsyncIterable<Uint8Array> {
  const handle = nativeOf(world);
  const o = options(opts, 'exportRuns options', ['runIds', 'status', 'endedBefore']);
  const request: Record<string, unknown> = {};
  if (o.runIds !== undefined) {
    if (!Array.isArray(o.runIds) || !o.runIds.every((id) => typeof id === 'string')) invalid('runIds', 'must be an array of run ids');
    for (const id of o.runIds) checkRunIdType(id);
    request.runIds = [...o.runIds];
  }
  if (o.status !== undefined) request.status = statusList('status', o.status);
  if (o.endedBefore !== undefined) request.endedBefore = isoTime('endedBefore', o.endedBefore);
  const text = JSON.stringify(request);
  // The options are judged now, by the core, so that a bad one is thrown here and not at the
  // first read; each iteration then starts an export of its own.
  callSync(() => handle.exportStart(text));
  return {
    async *[Symbol.asyncIterator]() {
      const cursor = callSync(() => handle.exportStart(text));
      for (;;) {
        const piece = await call(() => handle.exportNext(cursor));
        if (piece === undefined || piece === null) return;
        yield piece;
      }
    },
  };
}

/** Bytes handed to the core at a time by {@link importRuns}. */
const IMPORT_PIECE = 1 << 20;

/**
 * Read an archive that {@link exportRuns} (or `little export`) wrote into this world, from any
 * world kind to any other. Every event, sequence, `eventId`, `recordedAt`, key and digest is kept
 * byte for byte, and re-checked: each event goes through the append rules again and must make the
 * archive's envelope exactly, and each artifact must hash to its manifest. A damaged or truncated
 * archive is refused with a typed error naming the run and the line; nothing of that run is
 * committed, and the runs before it stay imported. Importing an archive again changes nothing; a
 * run the world holds a prefix of gets the rest; a run whose events differ is refused
 * (`EventSequenceConflictError`) and kept as it is.
 */
export async function importRuns(world: World, source: AsyncIterable<Uint8Array> | Iterable<Uint8Array>): Promise<ImportedRuns> {
  const handle = nativeOf(world);
  const iterable = source as { [Symbol.asyncIterator]?: unknown; [Symbol.iterator]?: unknown } | null;
  if (iterable === null || typeof iterable !== 'object' || (typeof iterable[Symbol.asyncIterator] !== 'function' && typeof iterable[Symbol.iterator] !== 'function')) {
    invalid('source', 'must be an iterable or async iterable of Uint8Array pieces (a file stream, process.stdin, exportRuns(world))');
  }
  const cursor = callSync(() => handle.importStart());
  let held: Buffer[] = [];
  let size = 0;
  const push = async () => {
    const bytes = held.length === 1 ? held[0] : Buffer.concat(held, size);
    held = [];
    size = 0;
    await call(() => handle.importPush(cursor, bytes));
  };
  try {
    for await (const piece of source) {
      if (!types.isUint8Array(piece)) {
        invalid('source', 'must yield Uint8Array pieces');
      }
      held.push(Buffer.from(piece.buffer, piece.byteOffset, piece.byteLength));
      size += piece.byteLength;
      if (size >= IMPORT_PIECE) await push();
    }
    if (size > 0) await push();
    return frozen<ImportedRuns>(await call(() => handle.importFinish(cursor)));
  } finally {
    // Subscribers of the runs imported here find their new events.
    wakeSubscribers(world);
  }
}
