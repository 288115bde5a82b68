/**
 * @little-workflow/world: the durable storage layer of a TypeScript workflow runtime.
 *
 * This module is the thin front of a Rust core. It checks what only JavaScript can see (values
 * JSON cannot carry exactly, such as NaN, BigInt, cycles or `undefined` in an array), turns
 * payloads into JSON text on the way in and frozen objects on the way out, and maps the core's
 * error codes to the error classes below. Every rule about events lives in the core.
 */
import { realpathSync, statSync, watch, type FSWatcher } from 'node:fs';
import { setTimeout as after, clearTimeout as cancel } from 'node:timers';
import { join } from 'node:path';
import * as native from './index.js';

type NativeWorld = native.NativeWorld;

// ---------------------------------------------------------------------------------------------
// Errors

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

/** Turn an error from the native core into its class; anything else passes through. */
function fromNative(err: unknown): unknown {
  if (err instanceof WorldError || !(err instanceof Error)) return err;
  const code = (err as { code?: unknown }).code;
  const cls = typeof code === 'string' ? ERROR_CLASSES[code] : undefined;
  if (!cls) return err;
  let details: Record<string, unknown> = {};
  const raw = (err as { details?: unknown }).details;
  if (typeof raw === 'string') {
    try {
      details = JSON.parse(raw) as Record<string, unknown>;
    } catch {
      details = {};
    }
  }
  return new cls(code as string, err.message, details);
}

/** Run a native call, turning its errors (thrown or rejected) into the error classes. */
async function call<T>(f: () => Promise<T> | T): Promise<T> {
  try {
    return await f();
  } catch (err) {
    throw fromNative(err);
  }
}

function callSync<T>(f: () => T): T {
  try {
    return f();
  } catch (err) {
    throw fromNative(err);
  }
}

// ---------------------------------------------------------------------------------------------
// Values in and out

/** Deepest nesting of arrays and objects a payload may have. */
const MAX_DEPTH = 1000;

/** Stands in a path for an object key that looks like a credential (see `toJsonText`). */
const CREDENTIAL_KEY = '[<a key that looks like a credential>]';

function renderPath(root: string, segs: readonly (string | number)[], screenKeys = false): string {
  let s = root;
  for (const seg of segs) {
    if (typeof seg === 'number') s += `[${seg}]`;
    else if (screenKeys && native.looksLikeCredential(seg)) s += CREDENTIAL_KEY;
    else if (/^[A-Za-z_$][A-Za-z0-9_$]*$/.test(seg)) s += `.${seg}`;
    else s += `[${JSON.stringify(seg)}]`;
  }
  return s;
}

/**
 * Strings this long (in UTF-16 units) are sent to the core beside an append's JSON text: copying
 * one across costs a fraction of what `JSON.stringify` spends escaping it on this thread.
 */
const BESIDE_MIN = 4096;

/** How {@link snapshotOf} reads a value. */
interface Reading {
  /** The run the value belongs to, for errors. */
  runId?: string;
  /** Write no key that looks like a credential into a path (`CREDENTIAL_KEY` stands for it). */
  screenKeys?: boolean;
  /** Levels more allowed where the value wraps payloads: 1 for a list of run events, 2 for a list of envelopes. */
  around?: number;
  /** A key of the top-level object whose `undefined` value is kept, as `null`. */
  undefinedAsNull?: string;
}

/** What was thrown, named for a message without quoting it (it may hold a payload's values). */
function thrownName(err: unknown): string {
  if (err instanceof Error) return `a ${err.name}`;
  return err === null ? 'null' : `a ${typeof err}`;
}

/**
 * A plain copy of `value` as JSON would read it, reading every field, element and `toJSON` once:
 * the copy is what is validated and what is written, so a getter that answers differently on a
 * second read cannot make them differ. Refuses anything JSON cannot carry exactly: NaN and
 * ±Infinity, BigInt, functions, symbols, `undefined` inside an array or as the value itself, Map
 * and Set, lone surrogates, cycles, and nesting deeper than 1,000 levels. An `undefined` object
 * field is omitted and `toJSON` is honoured, as `JSON.stringify` does. Anything thrown while
 * reading (a getter, a Proxy's trap, a revoked Proxy, a `toJSON`) is an `EventValidationError`
 * naming the path, such as `payload.a[3].b`, with what was thrown as its `cause`. A `__proto__`
 * key stays a key of the copy.
 */
function snapshotOf(value: unknown, root: string, r: Reading = {}): unknown {
  return read(value, root, r).copy;
}

/** {@link snapshotOf}, and whether the copy holds a string of at least `BESIDE_MIN` units. */
function read(value: unknown, root: string, r: Reading): { copy: unknown; long: boolean } {
  let long = false;
  const segs: (string | number)[] = [];
  const ancestors = new Set<object>();
  const fail = (message: string, cause?: unknown): never => {
    const at = renderPath(root, segs, r.screenKeys);
    throw new EventValidationError('EVENT_VALIDATION', `${at}: ${message}`, { path: at, runId: r.runId }, cause === undefined ? undefined : { cause });
  };
  const walk = (v: unknown, key: string, depth: number, inArray: boolean): unknown => {
    if (v !== null && (typeof v === 'object' || typeof v === 'function' || typeof v === 'bigint')) {
      const toJSON = (v as { toJSON?: unknown }).toJSON;
      if (typeof toJSON === 'function') v = toJSON.call(v, key);
    }
    switch (typeof v) {
      case 'string':
        if (!v.isWellFormed()) fail('contains a lone surrogate, which JSON cannot carry exactly');
        if (v.length >= BESIDE_MIN) long = true;
        return v;
      case 'number':
        if (!Number.isFinite(v)) fail(`${v} cannot be stored in JSON`);
        return v;
      case 'boolean':
        return v;
      case 'bigint':
        return fail('a BigInt cannot be stored in JSON; convert it to a string or a safe number');
      case 'undefined':
        if (inArray) fail('undefined inside an array cannot be stored in JSON (it would become null)');
        if (depth === 1 - (r.around ?? 0)) fail('is undefined, which JSON cannot store');
        return undefined;
      case 'function':
      case 'symbol':
        return fail(`a ${typeof v} cannot be stored in JSON`);
    }
    if (v === null) return null;
    const obj = v as object;
    if (obj instanceof Map || obj instanceof Set) fail(`a ${obj instanceof Map ? 'Map' : 'Set'} cannot be stored in JSON; convert it to an object or an array`);
    if (obj instanceof Number || obj instanceof String || obj instanceof Boolean) return walk(obj.valueOf(), key, depth, inArray);
    if (depth > MAX_DEPTH) fail(`is nested deeper than ${MAX_DEPTH} levels`);
    if (ancestors.has(obj)) fail('is a cycle: the value contains itself');
    ancestors.add(obj);
    let copy: unknown;
    if (Array.isArray(obj)) {
      const n = obj.length;
      const out = new Array<unknown>(n);
      for (let i = 0; i < n; i++) {
        segs.push(i);
        out[i] = walk(obj[i], String(i), depth + 1, true);
        segs.pop();
      }
      copy = out;
    } else {
      const out: Record<string, unknown> = {};
      const top = depth === 1 - (r.around ?? 0);
      for (const k of Object.keys(obj)) {
        segs.push(k);
        if (!k.isWellFormed()) fail('this key contains a lone surrogate, which JSON cannot carry exactly');
        let field = walk((obj as Record<string, unknown>)[k], k, depth + 1, false);
        if (field === undefined && top && k === r.undefinedAsNull) field = null;
        // Assigned, `__proto__` would set the copy's prototype instead of adding the key.
        if (field !== undefined && k === '__proto__') Object.defineProperty(out, k, { value: field, enumerable: true, writable: true, configurable: true });
        else if (field !== undefined) out[k] = field;
        segs.pop();
      }
      copy = out;
    }
    ancestors.delete(obj);
    return copy;
  };
  try {
    const copy = walk(value, '', 1 - (r.around ?? 0), false);
    return { copy, long };
  } catch (err) {
    if (err instanceof WorldError) throw err;
    return fail(`could not be read: reading it threw ${thrownName(err)}`, err);
  }
}

/**
 * JSON text of `value`, read once (see {@link snapshotOf}). Given `beside`, strings of at least
 * `BESIDE_MIN` units go there instead, each replaced by `"\u0000<index>"`; so that every string
 * value starting with U+0000 is a placeholder, such short strings go beside it too.
 */
function toJsonText(value: unknown, root: string, r: Reading = {}, beside?: string[]): string {
  const { copy, long } = read(value, root, r);
  return jsonOf(copy, long ? beside : undefined);
}

/** JSON text of a {@link snapshotOf} copy; with `beside`, long strings go there (see {@link toJsonText}). */
function jsonOf(copy: unknown, beside?: string[]): string {
  if (beside === undefined) return JSON.stringify(copy);
  return JSON.stringify(copy, (_key, v: unknown) => {
    if (typeof v !== 'string' || (v.length < BESIDE_MIN && v.charCodeAt(0) !== 0)) return v;
    beside.push(v);
    return `\u0000${beside.length - 1}`;
  });
}

/**
 * The fields `keys` of an input object, each read once. A value that is not an object is an
 * `EventValidationError` at `path` saying it `must be` what `what` says; anything thrown while
 * reading (a getter, a Proxy's trap, a revoked Proxy) is one naming the field (`prefix` + key),
 * with what was thrown as its `cause`.
 */
function fieldsOf<K extends string>(value: unknown, path: string, prefix: string, keys: readonly K[], what: string, runId?: string): { [k in K]?: unknown } {
  let at = path;
  try {
    if (value === null || typeof value !== 'object' || Array.isArray(value)) invalid(path, what, runId);
    const out: { [k in K]?: unknown } = {};
    for (const k of keys) {
      at = `${prefix}${k}`;
      out[k] = (value as Record<K, unknown>)[k];
    }
    return out;
  } catch (err) {
    if (err instanceof WorldError) throw err;
    throw new EventValidationError('EVENT_VALIDATION', `${at}: could not be read: reading it threw ${thrownName(err)}`, { path: at, runId }, { cause: err });
  }
}

function deepFreeze<T>(value: T): T {
  if (value !== null && typeof value === 'object' && !Object.isFrozen(value)) {
    Object.freeze(value);
    for (const k of Object.keys(value)) deepFreeze((value as Record<string, unknown>)[k]);
  }
  return value;
}

/** Parse JSON text from the core and deep-freeze it. */
function frozen<T>(text: string): T {
  return deepFreeze(JSON.parse(text) as T);
}

/** `v instanceof C`, false where asking throws (a revoked Proxy's prototype cannot be read). */
function isInstance<T>(v: unknown, C: abstract new (...args: never[]) => T): v is T {
  try {
    return v instanceof C;
  } catch {
    return false;
  }
}

function isPlainRecord(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

/** RFC 8785 canonical JSON of a value, exactly as the world stores it. */
export function canonicalize(value: unknown): string {
  const text = toJsonText(value, 'value');
  return callSync(() => native.canonicalizeJson(text));
}

// ---------------------------------------------------------------------------------------------
// Worlds

/** How durable an append is when its promise resolves. */
export type Durability = 'full' | 'normal';

/** An open world. Pass it to the functions of this module. */
export interface World {
  readonly kind: 'local' | 'virtual';
  /** The resolved data directory of a local world. */
  readonly dataDir?: string;
  /**
   * Finish queued appends, then let go of the locks taken through this world, and release it.
   * Takers still waiting for a lock reject with `WorldClosedError`, as do later calls; a
   * `RunLock.release()` after the close resolves.
   */
  close(): Promise<void>;
}

/** Options of {@link localWorld}. */
export interface LocalWorldOptions {
  /** Default: `join(process.cwd(), '.little-workflow')`. */
  dataDir?: string;
  /** Default `'full'`: an append resolves only after its commit is on disk. */
  durability?: Durability;
  /** Prices merged over the bundled registry, model by model. */
  pricing?: PricingRegistry;
  /**
   * Open the world already at `dataDir` for reading only (default `false`). Nothing in the
   * directory is created, upgraded or cleaned up (SQLite may add the `-shm` and an empty `-wal`
   * file any reader of its WAL needs), so a world written by an earlier version of this package
   * stays openable by that version. Every write (appends, artifacts, locks,
   * outer-loop manifests) rejects with `WorldPathError`; reads and `subscribe` see what other
   * worlds commit. Opening fails with `WorldPathError` when no world is there.
   */
  readOnly?: boolean;
}

/** Options of {@link virtualWorld}. */
export interface VirtualWorldOptions {
  /** Prices merged over the bundled registry, model by model. */
  pricing?: PricingRegistry;
}

/**
 * Wakes a live subscription: given stream ids, only one of those streams (copies of this module of
 * earlier versions call it with none, and wake them all).
 */
type Waker = (streams?: string | ReadonlySet<string>) => void;

/**
 * The native handle of each open world, and the wakers of its live subscriptions (called after each
 * append this process commits). Kept on `globalThis` under a registered symbol, so two copies of
 * this module in one process (a bundler inlining one, Node loading another) share them.
 */
const shared = ((globalThis as Record<symbol, unknown>)[Symbol.for('@little-workflow/world:worlds')] ??= {
  natives: new WeakMap<World, NativeWorld>(),
  wakers: new WeakMap<World, Set<Waker>>(),
}) as { natives: WeakMap<World, NativeWorld>; wakers: WeakMap<World, Set<Waker>> };
const natives = shared.natives;
const wakers = shared.wakers;

/**
 * The local data directories open in this process (by real path, and by device and inode: see
 * `dirKeys`), with the copy of the addon that opened them and how many of
 * its worlds have each open. Shared, like `shared`, by every copy of this module in the process
 * (in one JavaScript realm), so that two copies of the package (two versions that npm could not
 * dedupe) never open one directory at once: each copy has its own SQLite, the two cannot see each
 * other's POSIX locks, and closing one copy's world deleted the WAL under the other's, with appends
 * it had acknowledged. A world's claim ends when its close has completed (when its last SQLite
 * connection is gone); a world collected without a close keeps its claim. The registry's shape
 * (its symbol, the `openDirs` map, keys `path:<real path>` and `inode:<dev>:<ino>`, and entries
 * `{ addon, worlds }`) is how versions of this package see each other: extend it, never change it.
 */
type OpenDirs = Map<string, { addon: string; worlds: number }>;
const openDirs: OpenDirs = ((shared as { openDirs?: OpenDirs }).openDirs ??= new Map());
const ADDON = native.addonInstanceId();
/** How each world lets go of its claim on its data directory (once). */
const claims = new WeakMap<World, () => void>();
/** Each world's close, once called. */
const closings = new WeakMap<World, Promise<void>>();

/**
 * The keys of a directory in `openDirs`: its real path, and its device and inode (which a bind
 * mount shares, and which a directory deleted and made again at the same path does not). None
 * when there is no such directory.
 */
function dirKeys(dir: string): string[] {
  try {
    const st = statSync(dir, { bigint: true });
    return [`path:${realpathSync.native(dir)}`, `inode:${st.dev}:${st.ino}`];
  } catch {
    return [];
  }
}

/** Refuse `dataDir` while another copy of the addon has it open. */
function checkNoOtherCopy(dataDir: string): void {
  for (const key of dirKeys(dataDir)) {
    const held = openDirs.get(key);
    if (held !== undefined && held.worlds > 0 && held.addon !== ADDON) {
      throw new WorldPathError(
        'WORLD_PATH',
        `${dataDir} is open through another copy of @little-workflow/world in this process: two copies of ` +
          'SQLite in one process cannot see each other\'s locks and would lose appends. Load one copy ' +
          '(npm dedupe, or one version for every dependent), or close the other copy\'s worlds first',
        { path: dataDir },
      );
    }
  }
}

/** Record that `world` has the directory `dir` open through this copy, until its close completes. */
function claimDir(world: World, dir: string): void {
  const held = dirKeys(dir).map((key) => {
    let h = openDirs.get(key);
    if (h === undefined || h.worlds === 0) openDirs.set(key, (h = { addon: ADDON, worlds: 0 }));
    h.worlds++;
    return [key, h] as const;
  });
  let done = false;
  claims.set(world, () => {
    if (done) return;
    done = true;
    for (const [key, h] of held) if (--h.worlds === 0 && openDirs.get(key) === h) openDirs.delete(key);
  });
}

/** Wake the world's subscriptions of `streams` (one id, or several), or all of them. */
function wakeSubscribers(world: World, streams?: string | ReadonlySet<string>): void {
  const set = wakers.get(world);
  if (set) for (const wake of [...set]) wake(streams);
}

class OpenWorld implements World {
  readonly kind: 'local' | 'virtual';
  readonly dataDir?: string;

  constructor(handle: NativeWorld) {
    this.kind = handle.kind as 'local' | 'virtual';
    if (handle.dataDir !== null) this.dataDir = handle.dataDir;
    natives.set(this, handle);
    Object.freeze(this);
  }

  close(): Promise<void> {
    // A second close gets the first's promise: it completes when the first has (the native
    // close of a world closed before finishes at once, while the first may still be committing).
    let closing = closings.get(this);
    if (closing === undefined) {
      closing = this.closeOnce().catch((err: unknown) => {
        closings.delete(this); // a close that failed may be tried again
        throw err;
      });
      closings.set(this, closing);
    }
    return closing;
  }

  private async closeOnce(): Promise<void> {
    await call(() => handleOf(this).close());
    claims.get(this)?.();
    wakeSubscribers(this); // live subscriptions notice the close now, not at their next poll
    // A subscription paused between two events would otherwise keep the watcher (an inotify
    // descriptor) until its consumer pulls again, which may be never.
    watchers.get(this)?.stop();
  }
}

function handleOf(world: World): NativeWorld {
  const handle = natives.get(world);
  if (!handle) invalid('world', 'must be a World returned by localWorld() or virtualWorld()');
  return handle;
}

/** The native handle of an open world. A closed one says so before any argument is looked at. */
function nativeOf(world: World): NativeWorld {
  const handle = handleOf(world);
  if (handle.closed) throw closedError();
  return handle;
}

function closedError(): WorldClosedError {
  return new WorldClosedError('WORLD_CLOSED', 'the world is closed', {});
}

/** The fields `keys` of an options object (none when it is `undefined`), each read once (see {@link fieldsOf}). */
function options<T extends object, K extends keyof T & string>(value: T | undefined, name: string, keys: readonly K[]): Partial<Pick<T, K>> {
  if (value === undefined) return {};
  return fieldsOf(value, name, '', keys, 'must be an object') as Partial<Pick<T, K>>;
}

/**
 * Open (creating if needed) a world on disk: SQLite in WAL mode plus artifact files. With
 * `readOnly`, open an existing one for reading only.
 */
export function localWorld(opts?: LocalWorldOptions): World {
  const o = options(opts, 'localWorld options', ['dataDir', 'durability', 'pricing', 'readOnly']);
  const dataDir = o.dataDir ?? join(process.cwd(), '.little-workflow');
  if (typeof dataDir !== 'string' || dataDir.length === 0) {
    throw new WorldPathError('WORLD_PATH', 'dataDir must be a non-empty string', { path: 'dataDir' });
  }
  // As UTF-8 a lone surrogate would become U+FFFD: two different dataDirs, one world.
  if (!dataDir.isWellFormed()) {
    throw new WorldPathError('WORLD_PATH', 'dataDir contains a lone surrogate, which a path cannot carry exactly', { path: 'dataDir' });
  }
  const durability = o.durability ?? 'full';
  if (typeof durability !== 'string') invalid('durability', "must be 'full' or 'normal'");
  const pricing = pricingText(o.pricing);
  const readOnly = o.readOnly ?? false;
  if (typeof readOnly !== 'boolean') invalid('readOnly', 'must be a boolean');
  checkNoOtherCopy(dataDir);
  const world = new OpenWorld(callSync(() => native.NativeWorld.openLocal(dataDir, durability, pricing, readOnly)));
  claimDir(world, world.dataDir as string);
  return world;
}

/** Open a fresh world in memory: the same rules, nothing on disk. */
export function virtualWorld(opts?: VirtualWorldOptions): World {
  const o = options(opts, 'virtualWorld options', ['pricing']);
  const pricing = pricingText(o.pricing);
  return new OpenWorld(callSync(() => native.NativeWorld.openVirtual(pricing)));
}

function pricingText(pricing: PricingRegistry | undefined): string | undefined {
  if (pricing === undefined) return undefined;
  const copy = snapshotOf(pricing, 'pricing');
  if (!isPlainRecord(copy)) invalid('pricing', 'must be a pricing registry object');
  return jsonOf(copy);
}

// ---------------------------------------------------------------------------------------------
// Ids and vocabularies, as the core has them

function idOf(kind: 'run' | 'session', id: unknown): boolean {
  if (typeof id !== 'string') return false;
  try {
    native.checkId(kind, id);
    return true;
  } catch {
    return false;
  }
}

/** Whether `id` is a run id: `run_` followed by 1–80 of `[A-Za-z0-9_-]`. */
export function isRunId(id: unknown): id is string {
  return idOf('run', id);
}

/** Whether `id` is a session id: `ses_` followed by 1–80 of `[A-Za-z0-9_-]`. */
export function isSessionId(id: unknown): id is string {
  return idOf('session', id);
}

/** The event types each vocabulary knows. */
export type KnownEventTypes = {
  /** The event log's own types (`RunStarted`, `harness.model.responded`, ...). */
  readonly events: readonly string[];
  /** The run events a run holds (`run:started`, `node:completed`, ...). */
  readonly runEvents: readonly string[];
  /** The run events a session holds (`session:*` and the types both carry). */
  readonly sessionEvents: readonly string[];
};

let knownTypes: KnownEventTypes | undefined;

/** The event types each vocabulary knows, as this build validates them. */
export function knownEventTypes(): KnownEventTypes {
  return (knownTypes ??= frozen<KnownEventTypes>(native.knownEventTypesJson()));
}

// ---------------------------------------------------------------------------------------------
// Event log

/** One committed fact of a run. */
export type EventEnvelope = {
  /** `evt_` + the first 16 hex of sha256(JCS({runId, sequence, type, payload})). */
  readonly eventId: string;
  readonly runId: string;
  /** 1-based, dense, strictly monotonic per run. */
  readonly sequence: number;
  readonly type: string;
  readonly appendIdempotencyKey?: string;
  /** `sha256:` + hex(sha256(JCS({runId, type, payload}))), set with a key. */
  readonly canonicalRequestDigest?: string;
  /** ISO-8601 UTC, millisecond precision. */
  readonly recordedAt: string;
  readonly payload: Readonly<Record<string, unknown>>;
};

/** What to append. */
export interface AppendEventInput {
  type: string;
  payload: Record<string, unknown>;
  /** Required for every type that starts with `harness.`. */
  appendIdempotencyKey?: string;
}

function checkRunIdType(runId: unknown, what = 'runId'): string {
  if (typeof runId !== 'string') {
    throw new WorldPathError('WORLD_PATH', `${what} must be a string, not ${runId === null ? 'null' : typeof runId}`, { path: what });
  }
  return runId;
}

function invalid(path: string, message: string, runId?: string): never {
  throw new EventValidationError('EVENT_VALIDATION', `${path}: ${message}`, { path, runId });
}

/**
 * Refuse a string with a lone surrogate. Strings cross into the core as UTF-8, where a lone
 * surrogate would silently become U+FFFD, so two different keys or names could become one.
 */
function wellFormed(path: string, value: string, runId?: string): void {
  if (!value.isWellFormed()) invalid(path, 'contains a lone surrogate, which UTF-8 cannot carry exactly', runId);
}

const INPUT_FIELDS = ['type', 'payload', 'appendIdempotencyKey'] as const;

/**
 * {@link appendEvent} with a payload of an interface type, which has no index signature and so is
 * no `Record<string, unknown>` to TypeScript. (Declared first, so that `Parameters<typeof
 * appendEvent>`, which reads the last declaration, still names {@link AppendEventInput}.)
 */
export function appendEvent(world: World, runId: string, input: Omit<AppendEventInput, 'payload'> & { payload: object }): Promise<EventEnvelope>;
/**
 * Append an event to a run's log. Resolves with the committed, deep-frozen envelope once its row
 * is committed (as durably as the world's `durability` says). A rejected append writes nothing
 * and consumes no sequence number.
 */
export function appendEvent(world: World, runId: string, input: AppendEventInput): Promise<EventEnvelope>;
export function appendEvent(world: World, runId: string, input: AppendEventInput | (Omit<AppendEventInput, 'payload'> & { payload: object })): Promise<EventEnvelope> {
  // Not an async function: an append is on every hot path, and each promise layer costs a
  // microtask. Errors found here still reject the returned promise; nothing is thrown.
  let pending: Promise<string>;
  let handle: NativeWorld | undefined;
  try {
    handle = handleOf(world);
    checkRunIdType(runId);
    const { type, payload, appendIdempotencyKey } = fieldsOf(input, 'input', '', INPUT_FIELDS, 'must be an object with type and payload', runId);
    if (typeof type !== 'string') invalid('type', 'must be a string', runId);
    wellFormed('type', type, runId);
    if (appendIdempotencyKey !== undefined) {
      if (typeof appendIdempotencyKey !== 'string') invalid('appendIdempotencyKey', 'must be a string', runId);
      wellFormed('appendIdempotencyKey', appendIdempotencyKey, runId);
    }
    // A colon type is a run event's (or a namespace's that may become one): its errors name no
    // key that looks like a credential, as appendRunEvent's do not.
    const { copy, long } = read(payload, 'payload', { runId, screenKeys: type.includes(':') });
    if (!isPlainRecord(copy)) invalid('payload', 'must be an object', runId);
    const beside: string[] = [];
    const payloadJson = jsonOf(copy, long ? beside : undefined);
    pending = handle.append(runId, type, payloadJson, appendIdempotencyKey, beside.length > 0 ? beside : undefined);
  } catch (err) {
    // As nativeOf, a closed world says so rather than what is wrong with the arguments; asked
    // only once they are refused, so that an append does not pay for it (the core checks too).
    return Promise.reject(handle?.closed ? closedError() : fromNative(err));
  }
  return pending.then(
    (text) => {
      wakeSubscribers(world, runId);
      return envelopeFromText(text);
    },
    (err: unknown) => {
      throw fromNative(err);
    },
  );
}

/** Options of {@link listEvents}. */
export interface ListEventsOptions {
  /** Only events with a greater sequence. Default 0. */
  afterSequence?: number;
  /** At most this many events. */
  limit?: number;
}

/**
 * A run's committed envelopes in sequence order, deep-frozen. Each payload is decoded the first
 * time it is read (then kept, deep-frozen): a listing of a large run costs little until its
 * payloads are used.
 */
export async function listEvents(world: World, runId: string, opts?: ListEventsOptions): Promise<readonly EventEnvelope[]> {
  const handle = nativeOf(world);
  checkRunIdType(runId);
  const o = options(opts, 'listEvents options', ['afterSequence', 'limit']);
  for (const name of ['afterSequence', 'limit'] as const) {
    const v = o[name];
    if (v !== undefined && (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0)) {
      invalid(name, 'must be a non-negative safe integer', runId);
    }
  }
  return (await listPacked(handle, runId, o.afterSequence, o.limit)).events;
}

/**
 * A run's envelopes after `after` (at most `limit`), with the length of the text they were cut
 * from. Given `maxUnits`, the listing ends with the first event that takes that text to
 * `maxUnits` (at least one event): one whose text is shorter holds every event there was.
 */
async function listPacked(handle: NativeWorld, runId: string, after?: number, limit?: number, maxUnits?: number): Promise<{ events: readonly EventEnvelope[]; units: number }> {
  const parts = (await call(() => handle.listPacked(runId, after, limit, maxUnits))) as unknown as (string | Buffer)[];
  let units = 0;
  for (let i = 0; i < parts.length; i += 2) units += (parts[i] as string).length;
  if (parts.length === 2) return { events: Object.freeze(unpack(runId, parts[0] as string, parts[1] as Buffer)), units };
  const all: EventEnvelope[] = [];
  for (let i = 0; i < parts.length; i += 2) for (const e of unpack(runId, parts[i] as string, parts[i + 1] as Buffer)) all.push(e);
  return { events: Object.freeze(all), units };
}

/** Envelopes at least this long (in UTF-16 units) come back from an append with a lazy payload. */
const LAZY_ENVELOPE_MIN = 4096;

/**
 * A frozen envelope from its canonical JSON, with the payload decoded on first read. The envelope
 * is `{…,"eventId":…,"payload":<payload>,"recordedAt":…}`: the keys before the payload hold
 * strings (which cannot contain an unescaped `"payload":`), and `,"recordedAt":` after it is the
 * last of its kind. Only the small rest is parsed now; a large payload costs nothing until read.
 */
function envelopeFromText(text: string): EventEnvelope {
  // A small envelope is cheaper to parse whole than to build lazily.
  if (text.length < LAZY_ENVELOPE_MIN) return frozen<EventEnvelope>(text);
  const start = text.indexOf('"payload":');
  const end = text.lastIndexOf(',"recordedAt":');
  if (start < 0 || end < start) return frozen<EventEnvelope>(text);
  const meta = JSON.parse(`${text.slice(0, start)}"payload":0${text.slice(end)}`) as Record<string, string> & { sequence: number };
  return lazyEnvelope(meta.runId, meta.sequence, meta.eventId, meta.recordedAt, meta.type, meta.appendIdempotencyKey ?? '', meta.canonicalRequestDigest ?? '', text.slice(start + 10, end));
}

/** Numbers per row of a packed listing (see src/core/events/packed.rs). */
const PACKED_STRIDE = 8;

/** Envelopes out of a packed listing: `table` holds per row the sequence and where each piece starts in `text`. */
function unpack(runId: string, text: string, table: Buffer): EventEnvelope[] {
  const t = new Float64Array(table.buffer, table.byteOffset, table.length / 8);
  const n = t.length / PACKED_STRIDE;
  const out = new Array<EventEnvelope>(n);
  for (let r = 0; r < n; r++) {
    const b = r * PACKED_STRIDE;
    out[r] = lazyEnvelope(
      runId,
      t[b],
      text.slice(t[b + 1], t[b + 2]),
      text.slice(t[b + 2], t[b + 3]),
      text.slice(t[b + 3], t[b + 4]),
      text.slice(t[b + 4], t[b + 5]),
      text.slice(t[b + 5], t[b + 6]),
      text.slice(t[b + 6], t[b + 7]),
    );
  }
  return out;
}

/**
 * Gives a plain object the private state of a lazy payload: a base constructor that returns its
 * argument makes `new LazyPayload(o, raw)` add the private fields to `o` itself, so an envelope
 * keeps `Object.prototype` (a plain object to every library) while all envelopes share one
 * getter. A getter written in an object literal would cost a closure and an accessor pair per
 * envelope, and leave V8 unable to share their shapes: twice the time of a listing.
 */
class ReturnsItsArgument {
  constructor(o: object) {
    return o;
  }
}
class LazyPayload extends ReturnsItsArgument {
  #raw: string;
  #payload: Record<string, unknown> | undefined;
  constructor(o: object, raw: string) {
    super(o);
    this.#raw = raw;
  }
  static read(o: object): Record<string, unknown> {
    let self = o as LazyPayload;
    // Read through an object that inherits from an envelope, as the getter of a literal would.
    while (!(#raw in self)) self = Object.getPrototypeOf(self) as LazyPayload;
    return (self.#payload ??= deepFreeze(LazyPayload.parse(self)));
  }
  /** The payload's stored text, parsed; text that does not parse is a damaged row. */
  private static parse(self: LazyPayload): Record<string, unknown> {
    try {
      return JSON.parse(self.#raw) as Record<string, unknown>;
    } catch (err) {
      const { runId, sequence } = self as unknown as EventEnvelope;
      throw new EventLogCorruptError('EVENT_LOG_CORRUPT', `event log corrupt (${runId} sequence ${sequence}): the stored payload does not parse as JSON`, { runId, sequence }, { cause: err });
    }
  }
}
const LAZY_PAYLOAD: PropertyDescriptor = {
  get(this: object) {
    return LazyPayload.read(this);
  },
  enumerable: true,
};

/** A frozen envelope whose payload is parsed and deep-frozen on first read. Keys in canonical order. */
function lazyEnvelope(runId: string, sequence: number, eventId: string, recordedAt: string, type: string, key: string, digest: string, raw: string): EventEnvelope {
  const e: Record<string, unknown> = key === '' ? { eventId } : { appendIdempotencyKey: key, canonicalRequestDigest: digest, eventId };
  Object.defineProperty(e, 'payload', LAZY_PAYLOAD);
  e.recordedAt = recordedAt;
  e.runId = runId;
  e.sequence = sequence;
  e.type = type;
  new LazyPayload(e, raw);
  return Object.freeze(e) as unknown as EventEnvelope;
}

/**
 * Check that `events` is one run's log as the world writes it: sequences 1..n in order, each
 * `eventId` (and `canonicalRequestDigest`) matching its content. Throws `EventLogCorruptError`.
 */
export function validateEventLogShape(events: readonly EventEnvelope[]): void {
  let copy: unknown;
  try {
    copy = snapshotOf(events, 'events', { around: 2 });
  } catch (err) {
    throw new EventLogCorruptError('EVENT_LOG_CORRUPT', `the log cannot be read as JSON: ${(err as Error).message}`, {}, { cause: err });
  }
  if (!Array.isArray(copy)) {
    throw new EventLogCorruptError('EVENT_LOG_CORRUPT', 'expected an array of envelopes', {});
  }
  const text = jsonOf(copy);
  callSync(() => native.validateEventLogShapeJson(text));
}

// ---------------------------------------------------------------------------------------------
// Artifacts

/** How an artifact's payload is carried. */
export type ArtifactEncoding = 'json' | 'utf8' | 'bytes';

/** What describes a stored artifact. */
export type ArtifactManifest = {
  /** `art_` + the first 16 hex of sha256(JCS({runId, stepPath, name, contentType, encoding, payloadHash})). */
  readonly artifactId: string;
  /** `artifact://` + artifactId: the form events carry. */
  readonly artifactRef: string;
  readonly runId: string;
  readonly stepPath: string;
  readonly name: string;
  readonly contentType: string;
  readonly encoding: ArtifactEncoding;
  /** `sha256:` + hex of the payload bytes. */
  readonly sha256: string;
  readonly sizeBytes: number;
  readonly createdAt: string;
};

/** What to store. */
export type WriteArtifactInput = {
  runId: string;
  stepPath: string;
  name: string;
  contentType: string;
} & (
  | { encoding: 'json'; payload: unknown }
  | { encoding: 'utf8'; payload: string }
  | { encoding: 'bytes'; payload: Uint8Array }
);

/** A stored artifact, verified. */
export type ReadArtifactResult = {
  readonly manifest: ArtifactManifest;
  /** The JSON value for `json`, a string for `utf8`, a Buffer for `bytes`. */
  readonly payload: unknown;
};

const ARTIFACT_FIELDS = ['runId', 'stepPath', 'name', 'contentType', 'encoding', 'payload'] as const;

/**
 * Store a payload as a content-addressed artifact and resolve with its manifest. Writing the same
 * artifact again verifies the stored blob and returns the stored manifest. Hashing and file I/O run
 * on the world's own threads; a `bytes` payload is copied during the call, so what is stored is
 * its bytes as they were then, whatever happens to the buffer after.
 */
export async function writeArtifact(world: World, input: WriteArtifactInput): Promise<ArtifactManifest> {
  const handle = nativeOf(world);
  const { runId, stepPath, name, contentType, encoding, payload } = fieldsOf(input, 'input', 'input.', ARTIFACT_FIELDS, 'must be an object');
  checkRunIdType(runId, 'input.runId');
  for (const [field, v] of [['stepPath', stepPath], ['name', name], ['contentType', contentType]] as const) {
    if (typeof v !== 'string') invalid(`input.${field}`, 'must be a string', runId as string);
    wellFormed(`input.${field}`, v, runId as string);
  }
  let text: string | undefined;
  let bytes: Buffer | undefined;
  if (encoding === 'json') {
    if (payload === undefined) invalid('input.payload', 'is missing', runId as string);
    text = toJsonText(payload, 'input.payload', { runId: runId as string });
  } else if (encoding === 'utf8') {
    if (typeof payload !== 'string') invalid('input.payload', "must be a string for encoding 'utf8'", runId as string);
    if (!(payload as string).isWellFormed()) invalid('input.payload', 'contains a lone surrogate, which UTF-8 cannot carry', runId as string);
    text = payload as string;
  } else if (encoding === 'bytes') {
    // isView looks at the value itself (a Proxy is not a view), with no getter or trap to run.
    if (!ArrayBuffer.isView(payload) || !(payload instanceof Uint8Array)) invalid('input.payload', "must be a Uint8Array for encoding 'bytes'", runId as string);
    const u8 = payload as Uint8Array;
    try {
      if (isDetached(u8)) invalid('input.payload', 'is backed by a detached ArrayBuffer (transferred away), which holds no bytes', runId as string);
      bytes = Buffer.isBuffer(u8) ? u8 : Buffer.from(u8.buffer, u8.byteOffset, u8.byteLength);
    } catch (err) {
      if (err instanceof WorldError) throw err;
      throw new EventValidationError('EVENT_VALIDATION', `input.payload: could not be read: reading it threw ${thrownName(err)}`, { path: 'input.payload', runId }, { cause: err });
    }
  } else {
    invalid('input.encoding', "must be 'json', 'utf8' or 'bytes'", runId as string);
  }
  const json = await call(() =>
    handle.writeArtifact(runId as string, stepPath as string, name as string, contentType as string, encoding as string, text, bytes),
  );
  return frozen<ArtifactManifest>(json);
}

/** Whether `u8` views an ArrayBuffer that was transferred away (it then reads as empty). */
function isDetached(u8: Uint8Array): boolean {
  if (u8.byteLength !== 0) return false;
  try {
    new Uint8Array(u8.buffer, 0, 0);
    return false;
  } catch {
    return true;
  }
}

/**
 * Read an artifact by reference (`artifact://art_…` or `art_…`), re-hashing its bytes. Throws
 * `ArtifactNotFoundError`, `ArtifactHashMismatchError` or `ArtifactManifestCorruptError`, and
 * `RuntimeIntegrityError` when a manifest's blob is missing.
 */
export async function readArtifact(world: World, ref: string): Promise<ReadArtifactResult> {
  const handle = nativeOf(world);
  if (typeof ref !== 'string') invalid('ref', 'must be a string');
  const [manifestJson, raw] = await call(() => handle.readArtifact(ref));
  const manifest = frozen<ArtifactManifest>(manifestJson);
  // A JSON payload is deep-frozen like every other value the world returns (a string is
  // immutable already; a Buffer's bytes cannot be frozen).
  const payload = manifest.encoding === 'json' ? frozen<unknown>(raw as string) : raw;
  return Object.freeze({ manifest, payload });
}

// ---------------------------------------------------------------------------------------------
// Materialization and pricing

/**
 * A pricing registry: USD per one million tokens. A registry given to a world is merged over the
 * bundled one model by model: a model it prices takes none of the bundled entries for it.
 */
export type PricingRegistry = {
  asOf?: string;
  models: Array<{
    provider: string;
    modelId: string;
    inputPerMTok: number;
    outputPerMTok: number;
    cacheReadPerMTok?: number;
    /**
     * From when this entry applies: an ISO-8601 instant with an offset, or a date (its midnight
     * UTC); without it, from the beginning. A model may have several entries; a call is priced by
     * the latest one in effect at its `recordedAt` (none in effect yet: unpriced, `null`).
     */
    effectiveFrom?: string;
    /** The provider's public price page (the bundled registry names one for every entry). */
    source?: string;
    note?: string;
  }>;
};

/** Tokens and priced dollars of a scope. */
export type UsageTotals = {
  readonly inputTokens: number;
  /** Subset of inputTokens. */
  readonly cachedInputTokens: number;
  readonly outputTokens: number;
  /** Subset of outputTokens. */
  readonly reasoningTokens: number;
  /** `null` = unpriced, NOT free: every call in scope was unpriced. `0` only when there were no calls. */
  readonly costUsd: number | null;
  readonly pricedCalls: number;
  readonly unpricedCalls: number;
};

/** One step of a run (or a parallel group or branch). */
export type MaterializedStepState = {
  readonly stepPath: string;
  readonly status: 'pending' | 'running' | 'completed' | 'failed';
  /** `stepKind` of its StepStarted, or `parallel.group` / `parallel.branch`. */
  readonly stepKind?: string;
  readonly groupId?: string;
  /** How many times it started (a retry is a second attempt). */
  readonly attempts: number;
  readonly startedAt?: string;
  readonly finishedAt?: string;
  readonly output?: unknown;
  readonly outputRef?: string;
  readonly error?: unknown;
  /** Model calls attributed to this step by `stepPath`. */
  readonly usage: UsageTotals;
};

/** A harness session seen in the run. */
export type MaterializedSession = {
  readonly sequence: number;
  readonly role: string;
  readonly runId: string;
  readonly manifestHash: string;
  readonly status: 'running' | 'completed' | 'failed';
};

/** A session whose manifest drifted. */
export type ManifestDrift = {
  readonly sequence: number;
  readonly role: string;
  /** `changed`: an earlier session of the role had another hash; `hash-mismatch`: the hash is not sha256 of the canonical manifest. */
  readonly reason: 'changed' | 'hash-mismatch';
  readonly manifestHash: string;
  readonly expected: string;
};

/** A run's state, folded from its events. */
export type MaterializedRunState = {
  readonly runId: string;
  readonly workflowVersionId?: string;
  readonly status: 'pending' | 'running' | 'completed' | 'failed';
  readonly startedAt?: string;
  readonly finishedAt?: string;
  readonly lastRecordedAt?: string;
  readonly output?: unknown;
  readonly outputRef?: string;
  /** Run-wide tokens and priced dollars. */
  readonly usage: UsageTotals;
  /**
   * The same, per `provider/modelId`. The provider's own `%` and `/` are written `%25` and `%2F`,
   * so the first `/` ends it and no two models share a key.
   */
  readonly usageByModel: Readonly<Record<string, UsageTotals>>;
  readonly steps: Readonly<Record<string, MaterializedStepState>>;
  /** Every artifact reference in the run's payloads, in order of first appearance. */
  readonly artifacts: readonly string[];
  readonly sessions: readonly MaterializedSession[];
  readonly manifestDrift: readonly ManifestDrift[];
  readonly outerLoop?: { readonly outerLoopId: string; readonly cycleNumber: number; readonly lastKind: string };
  readonly error?: unknown;
  readonly eventCount: number;
  /** `asOf` of the registry that priced the run. */
  readonly pricingAsOf?: string;
};

/** Fold a run's stored events into its state, inside the native core. Deep-frozen. */
export async function materializeRunState(world: World, runId: string): Promise<MaterializedRunState> {
  const handle = nativeOf(world);
  checkRunIdType(runId);
  const text = await call(() => handle.materialize(runId));
  return frozen<MaterializedRunState>(text);
}

/**
 * Fold events into a run's state: a pure function, the same events always give the same state.
 * Calls are priced with the bundled registry, and `options.pricing` merged over it.
 */
export function materializeRunStateFromEvents(
  runId: string,
  events: readonly EventEnvelope[],
  opts?: { pricing?: PricingRegistry },
): MaterializedRunState {
  checkRunIdType(runId);
  const copy = snapshotOf(events, 'events', { runId, around: 2 });
  if (!Array.isArray(copy)) invalid('events', 'must be an array of envelopes', runId);
  const o = options(opts, 'materializeRunStateFromEvents options', ['pricing']);
  const text = jsonOf(copy);
  const pricing = pricingText(o.pricing);
  return frozen<MaterializedRunState>(callSync(() => native.materializeEventsJson(runId, text, pricing)));
}

/** The pricing registry bundled with the package (a fresh copy). */
export function bundledPricing(): PricingRegistry {
  return JSON.parse(native.bundledPricingJson()) as PricingRegistry;
}

// ---------------------------------------------------------------------------------------------
// Locks and outer loops

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

/** The cycle-level durability record of an outer loop (seed 001). */
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

// ---------------------------------------------------------------------------------------------
// Inspection (what `little` uses)

/** One thing `verifyWorld` found wrong. */
export type VerifyProblem = {
  /**
   * `hole`, `not-canonical`, `row-mismatch`, `event-id`, `unreadable`, `run-event-body` (of an
   * event); `missing-artifact`, `artifact-hash`, `artifact-manifest`, `artifact-integrity`,
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

// ---------------------------------------------------------------------------------------------
// Watching a run live

/**
 * How often a world with subscribers is asked what other processes committed, should nothing look
 * sooner (see `liveView`).
 */
const SUBSCRIBE_POLL_MS = 100;

/**
 * How often a subscriber of a virtual world, waiting for an event only this process can append,
 * looks again. Its timer keeps the process alive while it waits, as a live tail should.
 */
const VIRTUAL_POLL_MS = 1000;

/** Per local world, while it has subscribers: its live view (see `liveView`). */
const watchers = new WeakMap<World, Live>();

/**
 * A local world's live view, shared by its subscribers: how many there are and how many wait for
 * an event, a promise of its first look (its mark), and ways to keep the process alive while one
 * waits and to stop.
 */
type Live = { subscribers: number; waiting: number; ready: Promise<void>; keepAlive: () => void; stop: () => void };

/**
 * How long after a reported change the world is looked at. A commit's last write reaches the WAL
 * file (and is reported) just before the commit becomes visible to readers; looked at at once, it
 * could show nothing yet. Changes reported meanwhile are coalesced into the same look.
 */
const WATCH_DELAY_MS = 3;

/**
 * When, after that first look, the world is looked at again (each delay counted from the one
 * before), unless new changes start over. SQLite makes a commit visible through shared memory,
 * which reports nothing, after the commit's last reported write; on a busy machine the writer
 * can be descheduled in between for longer than `WATCH_DELAY_MS`, and the first look then finds
 * nothing. Without these, such an event waited for the poll (or, with the poll's timer held back
 * by fake timers, for ever).
 */
const WATCH_LATE_MS = [20, 80, 400];

/**
 * The live view of a local world (none for a virtual one, which only this process appends to, and
 * whose appends wake their subscribers themselves). It asks the world what was committed since its
 * last look (`changes`: the streams with rows after a mark) and wakes only the subscribers of those
 * streams: whenever the world's log files change, as another process's commit changes them (so
 * such events are seen at once), and every `SUBSCRIBE_POLL_MS` besides, should the file system not
 * report changes, as on some network mounts. One look per world, however many subscribers it has:
 * each subscriber reading its stream at each poll and at each change anywhere in the world cost a
 * core for 1,000 idle subscriptions. A commit reports several changes, and a process appending fast
 * reports thousands a second: see `WATCH_DELAY_MS`. (The watcher's timers are `node:timers`' own,
 * which fake timers installed on the global object leave running; the poll's is the global one.)
 */
function liveView(world: World, handle: NativeWorld): Live | undefined {
  const dataDir = world.dataDir;
  // A world opened by an earlier copy of this package (see `shared`) has a handle without
  // `changes`: its subscribers poll their streams themselves, as that copy's do.
  if (dataDir === undefined || typeof (handle as { changes?: unknown }).changes !== 'function') return undefined;
  const existing = watchers.get(world);
  if (existing !== undefined) return existing;
  let mark: number | undefined;
  let marked = false;
  let looking = false;
  let again = false;
  let stopped = false;
  let poll: ReturnType<typeof setTimeout> | undefined;
  let pending: ReturnType<typeof after> | undefined;
  let firstDelay = false;
  let watcher: FSWatcher | undefined;
  let markTaken!: () => void;
  const schedule = () => {
    clearTimeout(poll);
    if (stopped) return;
    poll = setTimeout(look, SUBSCRIBE_POLL_MS);
    // Only a subscriber waiting for an event keeps the process alive: one parked between two
    // events, whose consumer may never pull again, does not.
    if (live.waiting === 0) poll.unref?.();
  };
  const look = () => {
    if (stopped) return;
    if (looking) {
      again = true;
      return;
    }
    looking = true;
    // Called inside a promise: a throw (by a native handle of an earlier copy of this package,
    // which has no `changes`) fails the look rather than leaving it in progress for ever.
    Promise.resolve(mark).then((since) => handle.changes(since)).then(
      (text) => {
        const c = JSON.parse(text) as { mark: number; streams: string[] | null };
        const first = mark === undefined;
        mark = c.mark;
        if (first && !marked) {
          // Subscribers read only once the mark is taken: what commits after it, the next look finds.
          marked = true;
          markTaken();
        } else if (first || c.streams === null) {
          wakeSubscribers(world); // a first look that failed left no mark: anything may have changed
        } else if (c.streams.length > 0) {
          wakeSubscribers(world, new Set(c.streams));
        }
      },
      () => {
        // Closed, or failing: each subscriber reads, and finds what there is or reports the error.
        if (!marked) {
          marked = true;
          markTaken();
        }
        wakeSubscribers(world);
      },
    ).finally(() => {
      looking = false;
      if (again) {
        again = false;
        look();
      } else {
        schedule();
      }
    });
  };
  // Look now, then again after each of WATCH_LATE_MS from `late` on.
  const lookThenLater = (late: number) => {
    pending = undefined;
    look();
    if (late < WATCH_LATE_MS.length) pending = after(() => lookThenLater(late + 1), WATCH_LATE_MS[late]).unref();
  };
  const live: Live = {
    subscribers: 0,
    waiting: 0,
    ready: new Promise<void>((resolve) => (markTaken = resolve)),
    // A subscriber waits now: the poll keeps the process alive (the next is scheduled so if due).
    keepAlive: () => poll?.ref?.(),
    stop: () => {
      stopped = true;
      watcher?.close();
      cancel(pending);
      clearTimeout(poll);
      if (!marked) {
        marked = true;
        markTaken();
      }
      if (watchers.get(world) === live) watchers.delete(world);
    },
  };
  try {
    // Not persistent: the watcher adds nothing to what keeps the process alive.
    watcher = watch(join(dataDir, 'events'), { persistent: false }, () => {
      if (firstDelay) return; // joins the look already due
      cancel(pending); // a change during the late looks starts over
      firstDelay = true;
      pending = after(() => {
        firstDelay = false;
        lookThenLater(0);
      }, WATCH_DELAY_MS).unref();
    });
    // A watcher that fails leaves the poll.
    watcher.on('error', () => {
      watcher?.close();
      watcher = undefined;
    });
  } catch {
    watcher = undefined;
  }
  watchers.set(world, live);
  look();
  return live;
}

/**
 * Events fetched per read, and about how much text (in UTF-16 code units: whole events, at least
 * one): a slow consumer holds at most one page. By count alone, a page of a run of 4 MB model
 * calls held 1 GB, for each subscriber (each client of `little serve`).
 */
const SUBSCRIBE_PAGE = 256;
const SUBSCRIBE_PAGE_UNITS = 4 << 20;

/** What each AbortSignal given to subscriptions ends, through one listener per signal. */
const aborters = new WeakMap<AbortSignal, Set<() => void>>();

/**
 * Call `f` when `signal` aborts, until the returned function is called. One listener per signal,
 * however many subscriptions share it: a listener each made Node warn of a leak
 * (`MaxListenersExceededWarning`) at the eleventh.
 */
function whenAborted(signal: AbortSignal, f: () => void): () => void {
  let set = aborters.get(signal);
  if (set === undefined) {
    const fs = (set = new Set());
    aborters.set(signal, fs);
    signal.addEventListener('abort', () => {
      aborters.delete(signal);
      for (const g of [...fs]) g();
    }, { once: true });
  }
  const mine = set;
  mine.add(f);
  return () => {
    mine.delete(f);
  };
}

/** Options of {@link subscribe}. */
export interface SubscribeOptions {
  /** Start after this sequence (default 0: from the first event). */
  afterSequence?: number;
  /** Ends the subscription when aborted. */
  signal?: AbortSignal;
}

/**
 * The committed events of a run (or session) after `afterSequence`, in order, then each new one as
 * it commits, including those appended by other processes on the same data directory (seen within
 * about 100 ms). Never skips or repeats a sequence. Ends when `signal` aborts, when `return()` is
 * called (even while a `next()` waits for an event: that one then resolves as done), or when the
 * world closes (at once, with no more of a page already read); what it holds (its wake-up, the
 * watcher of other processes' commits) is let go of at that moment, whether or not its consumer
 * pulls again. On a world already closed, the first `next()` rejects with `WorldClosedError`.
 * Events are read a page at a time as the consumer pulls, so a slow consumer holds a bounded buffer.
 */
export function subscribe(world: World, streamId: string, opts?: SubscribeOptions): AsyncGenerator<EventEnvelope, void, undefined> {
  return new Subscription(world, streamId, opts);
}

const DONE: IteratorReturnResult<void> = Object.freeze({ done: true, value: undefined });

/**
 * A live subscription. Not an async generator: a generator's `return()` waits for a pending
 * `next()`, which for a run that never grows again waits (and polls) for ever, and a generator
 * parked between two events lets go of nothing until its consumer pulls again.
 */
class Subscription implements AsyncGenerator<EventEnvelope, void, undefined> {
  private started = false;
  private finished = false;
  private handle: NativeWorld | undefined;
  private after = 0;
  private signal: AbortSignal | undefined;
  private page: EventEnvelope[] = [];
  /** Whether a page has been read yet (the first read does not wait), and whether the last was full. */
  private readOnce = false;
  private lastPageFull = false;
  /** Set when a wake came while reading, not waiting: what woke it may have committed after the read began. */
  private woken = false;
  /** Ends the current wait, if one is in progress. */
  private wake: (() => void) | undefined;
  private unwatch: (() => void) | undefined;
  /** The world's live view, while this uses it (none for a virtual world). */
  private live: Live | undefined;
  /** Ends a wait for the live view's mark. */
  private unready: (() => void) | undefined;
  private unlisten: (() => void) | undefined;
  /** Serializes `next()` calls, as a generator does. */
  private queue: Promise<unknown> = Promise.resolve();
  private readonly waker: Waker = (streams) => {
    if (typeof streams === 'string' ? streams !== this.streamId : streams !== undefined && !streams.has(this.streamId)) return;
    if (this.handle?.closed) this.finish();
    else if (this.wake) this.wake();
    else this.woken = true;
  };
  private readonly onAbort = () => this.finish();

  constructor(
    private readonly world: World,
    private readonly streamId: string,
    private readonly opts: SubscribeOptions | undefined,
  ) {}

  next(): Promise<IteratorResult<EventEnvelope, void>> {
    const pulled = this.queue.then(() => this.pull());
    this.queue = pulled.catch(() => {});
    return pulled;
  }

  return(value?: void | PromiseLike<void>): Promise<IteratorResult<EventEnvelope, void>> {
    this.finish();
    return Promise.resolve(value).then((v) => ({ done: true, value: v }));
  }

  throw(err?: unknown): Promise<IteratorResult<EventEnvelope, void>> {
    this.finish();
    return Promise.reject(err);
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.finish();
  }

  /** Checks its arguments and starts listening for wakes: on the first `next()`, as a generator would. */
  private start(): void {
    this.started = true;
    this.handle = nativeOf(this.world);
    checkRunIdType(this.streamId, 'streamId');
    const o = options(this.opts, 'subscribe options', ['afterSequence', 'signal']);
    const after = o.afterSequence ?? 0;
    if (!Number.isSafeInteger(after) || after < 0) invalid('afterSequence', 'must be a non-negative safe integer');
    const signal = o.signal;
    if (signal !== undefined && !isInstance(signal, AbortSignal)) invalid('signal', 'must be an AbortSignal');
    this.after = after;
    this.signal = signal;
    let set = wakers.get(this.world);
    if (!set) wakers.set(this.world, (set = new Set()));
    set.add(this.waker);
    const live = liveView(this.world, this.handle);
    if (live !== undefined) {
      this.live = live;
      live.subscribers++;
      this.unwatch = () => {
        this.live = undefined;
        if (--live.subscribers === 0) live.stop();
      };
    }
    if (signal !== undefined) this.unlisten = whenAborted(signal, this.onAbort);
  }

  /** Stop, and let go of everything at once; a waiting `next()` resolves as done. */
  private finish(): void {
    if (this.finished) return;
    this.finished = true;
    this.page = [];
    wakers.get(this.world)?.delete(this.waker);
    this.unwatch?.();
    this.unlisten?.();
    this.wake?.();
    this.unready?.();
  }

  /** Until the live view has its mark, or this ends (a wake meanwhile is remembered, not acted on). */
  private untilReady(live: Live): Promise<void> {
    return new Promise<void>((resolve) => {
      const done = () => {
        this.unready = undefined;
        resolve();
      };
      this.unready = done;
      live.ready.then(done, done);
    });
  }

  private async pull(): Promise<IteratorResult<EventEnvelope, void>> {
    if (this.finished) return DONE;
    try {
      if (!this.started) this.start();
      for (;;) {
        if (this.signal?.aborted) this.finish();
        if (this.finished) return DONE;
        const next = this.page.shift();
        if (next !== undefined) {
          // Once the world has closed, not even the rest of a page already read.
          if (this.handle?.closed) {
            this.finish();
            return DONE;
          }
          this.after = next.sequence;
          return { done: false, value: next };
        }
        // After a short page, wait for a wake (unless one came meanwhile) before reading again.
        if (this.readOnce && !this.lastPageFull && !this.woken) await this.waitForWake();
        // The first read only once the live view has its mark: a commit after the read is then one
        // its next look finds.
        else if (!this.readOnce && this.live !== undefined) await this.untilReady(this.live);
        if (this.finished) return DONE;
        this.woken = false;
        this.readOnce = true;
        let page: { events: readonly EventEnvelope[]; units: number };
        try {
          page = await listPacked(nativeOf(this.world), this.streamId, this.after, SUBSCRIBE_PAGE, SUBSCRIBE_PAGE_UNITS);
        } catch (err) {
          if (err instanceof WorldClosedError) {
            this.finish();
            return DONE;
          }
          throw err;
        }
        // A page ended by its size may be followed by more at once, as a full one may.
        this.lastPageFull = page.events.length === SUBSCRIBE_PAGE || page.units >= SUBSCRIBE_PAGE_UNITS;
        if (!this.finished) this.page = [...page.events];
      }
    } catch (err) {
      this.finish();
      throw err;
    }
  }

  /**
   * Until woken: by an append here, by the live view (a commit of another process), an abort or a
   * close; without a live view (a virtual world, or one an earlier copy of this package opened),
   * also by its own poll.
   */
  private waitForWake(): Promise<void> {
    return new Promise<void>((resolve) => {
      const live = this.live;
      const timer = live === undefined ? setTimeout(done, this.world.dataDir === undefined ? VIRTUAL_POLL_MS : SUBSCRIBE_POLL_MS) : undefined;
      if (live !== undefined && live.waiting++ === 0) live.keepAlive();
      const self = this;
      function done() {
        clearTimeout(timer);
        if (live !== undefined) live.waiting--;
        self.wake = undefined;
        resolve();
      }
      this.wake = done;
    });
  }
}

// ---------------------------------------------------------------------------------------------
// Run events (seed 004)

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

/** The cost restore of seed 004, in integer micro-cents. */
export type RunCosts = {
  /** The maximum over every durable absolute total (never a sum of deltas, never cost:updated). */
  readonly realizedCostMicrocents: number;
  /** Committed estimates less releases. */
  readonly conservativeMicrocents: number;
  readonly conservativeByModel: Readonly<Record<string, number>>;
  /** cost:attempt_settled rows with priced: false. */
  readonly unpricedAttempts: number;
};

/** A run's state folded from its run events (see `src/core/run_events/fold.rs`). */
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
 * micro-cents and token counts, the seed's refinements; no credential anywhere; nothing after the
 * run's terminal event and exactly one terminal per node). Resolves with the stored event.
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

/** Restore a run's costs from its events exactly as seed 004's fold rules say; row order does not matter. */
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
