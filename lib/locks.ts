// Locks across processes, and the outer-loop manifests their holders write.
import { WorldPathError, call, checkRunIdType, invalid } from './errors.js';
import { frozen, isPlainRecord, jsonOf, options, snapshotOf } from './json.js';
import { nativeOf, type World } from './worlds.js';

/** A held lock. `release()` is idempotent. */
export interface RunLock {
  readonly name: string;
  readonly token: string;
  release(): Promise<void>;
}

function waitOption(opts: { waitMs?: number } | undefined): number {
  const o = options(opts, 'lock options', ['waitMs']);
  const waitMs = o.waitMs ?? 0;
  if (typeof waitMs !== 'number' || !Number.isSafeInteger(waitMs) || waitMs < 0) invalid('waitMs', 'must be a non-negative safe integer');
  return waitMs;
}

async function acquire(world: World, kind: 'run' | 'outer-loop', id: string, waitMs: number): Promise<RunLock> {
  const handle = nativeOf(world);
  const held = JSON.parse(await call(() => handle.acquireLock(kind, id, waitMs))) as { name: string; token: string };
  // Releasing twice is a no-op: the second call gets the first's promise, so it cannot be refused
  // because another owner took the lock in between. A release that failed may be tried again.
  let releasing: Promise<void> | undefined;
  return Object.freeze({
    name: held.name,
    token: held.token,
    release: () =>
      (releasing ??= call(() => handle.releaseLock(held.name, held.token)).catch((err: unknown) => {
        releasing = undefined;
        throw err;
      })),
  });
}

/**
 * Fence a run across processes: resolves with the lock, or rejects with `RunLockedError` when a
 * live owner still holds it after `waitMs` (default 0). A lock whose owner process is gone is
 * recovered.
 */
export async function acquireRunLock(world: World, runId: string, opts?: { waitMs?: number }): Promise<RunLock> {
  nativeOf(world);
  checkRunIdType(runId);
  return acquire(world, 'run', runId, waitOption(opts));
}

/** Serialize callers sharing an outer loop, as {@link acquireRunLock} does for a run. */
export async function acquireOuterLoopLock(world: World, outerLoopId: string, opts?: { waitMs?: number }): Promise<RunLock> {
  nativeOf(world);
  checkRunIdType(outerLoopId, 'outerLoopId');
  return acquire(world, 'outer-loop', outerLoopId, waitOption(opts));
}

/** The cycle-level durability record of an outer loop. */
export type OuterLoopManifest = {
  outerLoopId: string;
  /** Identity of the loop's input; a write with another one is refused. */
  inputHash: string;
  goal?: { workflowDefinitionHash?: string; description?: string; [k: string]: unknown };
  maxCycles?: number;
  cycles?: Array<{ cycleNumber: number; runId: string; workflowVersionId?: string; status: string; output?: unknown; [k: string]: unknown }>;
  /**
   * Set before a cycle starts. A write that leaves it out keeps the stored one; `null` (or the key
   * present with the value `undefined`) clears it.
   */
  pendingCycleRunId?: string | null;
  result?: { kind: 'done'; finalOutput?: unknown; [k: string]: unknown };
  [k: string]: unknown;
};

/**
 * The stored manifest of an outer loop, or `undefined`. Deep-frozen. A stored file that is not a
 * JSON object naming this `outerLoopId` and an `inputHash` rejects with `RuntimeIntegrityError`.
 */
export async function readOuterLoopManifest(world: World, outerLoopId: string): Promise<OuterLoopManifest | undefined> {
  const handle = nativeOf(world);
  if (typeof outerLoopId !== 'string') throw new WorldPathError('WORLD_PATH', 'outerLoopId must be a string', { path: 'outerLoopId' });
  const text = await call(() => handle.readOuterLoop(outerLoopId));
  const m = frozen<OuterLoopManifest | null>(text);
  return m ?? undefined;
}

/**
 * Write an outer loop's manifest atomically (tmp + fsync + rename). Rejects with
 * `EventValidationError` when it does not have the shape of {@link OuterLoopManifest} (extra fields
 * are kept), and with `OuterLoopInputMismatchError` when the stored manifest has another
 * `inputHash`. Writes of one manifest from one process take turns; writers in several processes
 * should hold {@link acquireOuterLoopLock}.
 */
export async function writeOuterLoopManifest(world: World, manifest: OuterLoopManifest): Promise<void> {
  const handle = nativeOf(world);
  // JSON drops a key whose value is undefined, which would keep the stored marker; written as
  // `{ ...stored, pendingCycleRunId: undefined }`, it means to clear it.
  const copy = snapshotOf(manifest, 'manifest', { undefinedAsNull: 'pendingCycleRunId' });
  if (!isPlainRecord(copy)) invalid('manifest', 'must be an object');
  const text = jsonOf(copy);
  await call(() => handle.writeOuterLoop(text));
}
