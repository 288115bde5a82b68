// The errors the package throws: a class per stable code, the core's codes mapped to them, and
// the checks of an argument that throw them.
import { types } from 'node:util';

/** Base class of every error the package throws; `code` is stable, the message is for people. */
export class WorldError extends Error {
  readonly code: string;
  /** The run the error is about, when there is one. */
  readonly runId?: string;
  /** The field the error is about (`payload.a[3].b`), when there is one. */
  readonly path?: string;
  /** The sequence the error is about, when there is one. */
  readonly sequence?: number;
  /** The artifact the error is about, when there is one. */
  readonly artifactId?: string;
  /** Other context from the core (lock name, owner pid, sequences of refused rows, …). */
  readonly details: Readonly<Record<string, unknown>>;

  constructor(code: string, message: string, details: Record<string, unknown> = {}, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
    const d = Object.fromEntries(Object.entries(details).filter(([, v]) => v !== null && v !== undefined));
    this.details = Object.freeze(d);
    if (typeof d.runId === 'string') this.runId = d.runId;
    if (typeof d.path === 'string') this.path = d.path;
    if (typeof d.sequence === 'number') this.sequence = d.sequence;
    if (typeof d.artifactId === 'string') this.artifactId = d.artifactId;
  }
}

/** A run id, session id or data directory is malformed, or the directory is not a world. */
export class WorldPathError extends WorldError {}
/** A call was made on a closed world. */
export class WorldClosedError extends WorldError {}
/** An event (or other input) failed validation; `path` names the field. */
export class EventValidationError extends WorldError {}
/** An idempotency key was reused for different content. */
export class EventAppendIdempotencyConflictError extends WorldError {}
/** An append's `expectedSequence` was not the run's last sequence. */
export class EventSequenceConflictError extends WorldError {}
/** An append wrote an index entry that another run holds. */
export class IndexEntryConflictError extends WorldError {}
/** No artifact with that id exists in the world. */
export class ArtifactNotFoundError extends WorldError {}
/** Stored data failed an integrity check: tampering or disk damage. */
export class RuntimeIntegrityError extends WorldError {}
/** An artifact's bytes do not hash to its manifest's `sha256`. */
export class ArtifactHashMismatchError extends RuntimeIntegrityError {}
/** An artifact manifest is unreadable or disagrees with its blob. */
export class ArtifactManifestCorruptError extends RuntimeIntegrityError {}
/** The event log is damaged (a hole, an id that does not match, an unparseable row). */
export class EventLogCorruptError extends RuntimeIntegrityError {}
/** A lock is held by a live owner. */
export class RunLockedError extends WorldError {}
/** An outer-loop manifest was written with another `inputHash` than the stored one. */
export class OuterLoopInputMismatchError extends WorldError {}
/** A replay read found rows it would have to drop. */
export class ReplayRefusedError extends WorldError {}
/** The file system or the database failed (disk full, permissions, I/O error). */
export class WorldIoError extends WorldError {}

type ErrorClass = new (code: string, message: string, details?: Record<string, unknown>, options?: { cause?: unknown }) => WorldError;

const ERROR_CLASSES: Readonly<Record<string, ErrorClass>> = Object.freeze({
  WORLD_PATH: WorldPathError,
  WORLD_CLOSED: WorldClosedError,
  EVENT_VALIDATION: EventValidationError,
  EVENT_APPEND_IDEMPOTENCY_CONFLICT: EventAppendIdempotencyConflictError,
  EVENT_SEQUENCE_CONFLICT: EventSequenceConflictError,
  INDEX_ENTRY_CONFLICT: IndexEntryConflictError,
  ARTIFACT_NOT_FOUND: ArtifactNotFoundError,
  RUNTIME_INTEGRITY: RuntimeIntegrityError,
  ARTIFACT_HASH_MISMATCH: ArtifactHashMismatchError,
  ARTIFACT_MANIFEST_CORRUPT: ArtifactManifestCorruptError,
  EVENT_LOG_CORRUPT: EventLogCorruptError,
  RUN_LOCKED: RunLockedError,
  OUTER_LOOP_INPUT_MISMATCH: OuterLoopInputMismatchError,
  REPLAY_REFUSED: ReplayRefusedError,
  WORLD_IO: WorldIoError,
});

/**
 * Turn an error from the native core into its class; anything else passes through. A core error is
 * known by its shape, a `code` of the table above and a string `message`, not by `instanceof
 * Error`: the addon makes its errors in Node's main context, while a test runner may load this
 * module in a `vm` context of its own (Jest, Vitest's `vmThreads`), whose `Error` is another. The
 * class made is this module's, so of the realm that loaded the package; the core's own error is
 * kept as its `cause`.
 */
export function fromNative(err: unknown): unknown {
  if (err === null || typeof err !== 'object' || err instanceof WorldError) return err;
  let code: unknown;
  let message: unknown;
  let raw: unknown;
  try {
    ({ code, message, details: raw } = err as { code?: unknown; message?: unknown; details?: unknown });
  } catch {
    return err;
  }
  // Own keys only: a code such as `constructor` must not find Object's.
  if (typeof code !== 'string' || typeof message !== 'string' || !Object.hasOwn(ERROR_CLASSES, code)) return err;
  let details: Record<string, unknown> = {};
  if (typeof raw === 'string') {
    try {
      const parsed: unknown = JSON.parse(raw);
      if (parsed !== null && typeof parsed === 'object' && !Array.isArray(parsed)) details = parsed as Record<string, unknown>;
    } catch {
      details = {};
    }
  }
  return new ERROR_CLASSES[code](code, message, details, { cause: err });
}

/** Run a native call, turning its errors (thrown or rejected) into the error classes. */
export async function call<T>(f: () => Promise<T> | T): Promise<T> {
  try {
    return await f();
  } catch (err) {
    throw fromNative(err);
  }
}

/** {@link call} for a synchronous native call. */
export function callSync<T>(f: () => T): T {
  try {
    return f();
  } catch (err) {
    throw fromNative(err);
  }
}

/** Throw an `EventValidationError` about the input at `path`. */
export function invalid(path: string, message: string, runId?: string): never {
  throw new EventValidationError('EVENT_VALIDATION', `${path}: ${message}`, { path, runId });
}

/**
 * Refuse a string with a lone surrogate. Strings cross into the core as UTF-8, where a lone
 * surrogate would silently become U+FFFD, so two different keys or names could become one.
 */
export function wellFormed(path: string, value: string, runId?: string): void {
  if (!value.isWellFormed()) invalid(path, 'contains a lone surrogate, which UTF-8 cannot carry exactly', runId);
}

/** `runId` (the argument `what`) when it is a string, else a `WorldPathError`; its form is the core's to check. */
export function checkRunIdType(runId: unknown, what = 'runId'): string {
  if (typeof runId !== 'string') {
    throw new WorldPathError('WORLD_PATH', `${what} must be a string, not ${runId === null ? 'null' : typeof runId}`, { path: what });
  }
  return runId;
}

/** The error of a call on a closed world. */
export function closedError(): WorldClosedError {
  return new WorldClosedError('WORLD_CLOSED', 'the world is closed', {});
}

/** What was thrown, named for a message without quoting it (it may hold a payload's values). */
export function thrownName(err: unknown): string {
  if (err === null) return 'null';
  // isNativeError knows an error of any realm; instanceof, one whose class extends Error. Either
  // may throw (a revoked Proxy, a getter), which leaves the type to name it.
  try {
    if (types.isNativeError(err) || err instanceof Error) {
      const name = (err as Error).name;
      if (typeof name === 'string') return `a ${name}`;
    }
  } catch {
    // Named by its type below.
  }
  return `a ${typeof err}`;
}
