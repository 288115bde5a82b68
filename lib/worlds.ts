// Open worlds: their handles in the core, the state this process keeps per world (shared by
// every copy of this module in the process), and localWorld / virtualWorld / postgresWorld.
import { realpathSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { WorldPathError, call, callSync, closedError, invalid } from './errors.js';
import { options } from './json.js';
import { native, type NativeWorld } from './native.js';
import { pricingText, type PricingRegistry } from './pricing.js';

/**
 * How durable an append is when its promise resolves. `'full'`: its commit is on disk, and no
 * crash loses it. `'normal'`: it is committed but may not be on disk yet. On a local world (SQLite,
 * `synchronous=NORMAL`) a crash of the process loses nothing that resolved, and a power loss or a
 * crash of the kernel may lose the last few commits. On a PostgreSQL world (`synchronous_commit`
 * off) a crash of the process loses nothing, and a crash of the database server may lose the
 * commits of its last few hundred milliseconds (up to three times its `wal_writer_delay`, 200 ms by
 * default), whose sequences then go to the events appended after.
 */
export type Durability = 'full' | 'normal';

/** An open world. Pass it to the functions of this package. */
export interface World {
  readonly kind: 'local' | 'virtual' | 'postgres';
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
  /**
   * Default `'full'`: an append resolves only after its commit is on disk. `'normal'`: a crash of
   * the process loses nothing that resolved; a power loss or a crash of the kernel may lose the
   * last few commits.
   */
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
  /** Keep the artifacts' bytes in an object store; see {@link ArtifactsOptions}. */
  artifacts?: ArtifactsOptions;
}

/**
 * Where a world keeps its artifacts' bytes: by default in its own store (the data directory, the
 * database); with `s3`, in an S3-compatible bucket (AWS S3, Cloudflare R2, MinIO), one object per
 * artifact at `<prefix><artifactId>`, written create-only before the manifest, which stays in the
 * world's own store. Credentials come from the AWS environment variables (`AWS_ACCESS_KEY_ID`,
 * `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`, a web identity, the container's or
 * instance's role) and are never shown in an error. Artifacts stored before the world had the
 * bucket stay where they are, and are read there.
 */
export interface ArtifactsOptions {
  s3: {
    bucket: string;
    /** Default `'little-workflow/'`. */
    prefix?: string;
    /** The store's URL (MinIO, R2, a test server); default: AWS for the region. */
    endpoint?: string;
    /** Default: `AWS_REGION`. */
    region?: string;
    /** `endpoint/bucket/key` rather than `bucket.endpoint/key` (MinIO, most test servers). */
    forcePathStyle?: boolean;
  };
}

/** The `artifacts` option as the addon takes it. */
function s3Of(artifacts: unknown): { bucket: string; prefix?: string; endpoint?: string; region?: string; forcePathStyle?: boolean } | undefined {
  if (artifacts === undefined) return undefined;
  const { s3 } = options(artifacts as ArtifactsOptions, 'artifacts', ['s3']);
  if (s3 === undefined) invalid('artifacts.s3', 'must be an object with a bucket');
  const o = options(s3, 'artifacts.s3', ['bucket', 'prefix', 'endpoint', 'region', 'forcePathStyle']);
  if (typeof o.bucket !== 'string' || o.bucket.length === 0) invalid('artifacts.s3.bucket', 'must be a non-empty string');
  for (const name of ['prefix', 'endpoint', 'region'] as const) {
    if (o[name] !== undefined && typeof o[name] !== 'string') invalid(`artifacts.s3.${name}`, 'must be a string');
  }
  if (o.forcePathStyle !== undefined && typeof o.forcePathStyle !== 'boolean') invalid('artifacts.s3.forcePathStyle', 'must be a boolean');
  return { bucket: o.bucket, prefix: o.prefix, endpoint: o.endpoint, region: o.region, forcePathStyle: o.forcePathStyle };
}

/** Options of {@link postgresWorld}. */
export interface PostgresWorldOptions {
  /**
   * `postgres://user:password@host:port/database?sslmode=…`, or libpq's `key=value` form. `sslmode`
   * has libpq's meanings (`disable`, `prefer` (the default), `require`, `verify-ca`,
   * `verify-full`), with `sslrootcert` (a PEM file, or `system`), `sslcert` and `sslkey`.
   */
  connectionString: string;
  /** Default `'little_workflow'`: created and migrated on first use. */
  schema?: string;
  /**
   * Default `'full'` (`synchronous_commit=on`): an append resolves only after its commit is on the
   * server's disk. `'normal'` (`synchronous_commit=off`): a crash of the database server may lose
   * the commits of its last few hundred milliseconds (up to three times its `wal_writer_delay`,
   * 200 ms by default), appends that had resolved among them, and their sequences then go to the
   * events appended after; a crash of this process loses nothing that resolved.
   */
  durability?: Durability;
  /** Prices merged over the bundled registry, model by model. */
  pricing?: PricingRegistry;
  /** Default 30000: how long a lock outlives a holder that stopped renewing it (a dead host). */
  lockLeaseMs?: number;
  /** Default 8 (at least 3): one for the writer, one for live notifications, the rest for reads. */
  maxConnections?: number;
  /**
   * Only read (default `false`): the schema is checked, never created or migrated, and every
   * write rejects with `WorldPathError`, as a local world's `readOnly` does.
   */
  readOnly?: boolean;
  /** Keep the artifacts' bytes in an object store; see {@link ArtifactsOptions}. */
  artifacts?: ArtifactsOptions;
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
export type Waker = (streams?: string | ReadonlySet<string>) => void;

/**
 * The native handle of each open world, and the wakers of its live subscriptions (called after each
 * append this process commits). Kept on `globalThis` under a registered symbol, so two copies of
 * this module in one process (a bundler inlining one, Node loading another) share them.
 */
const shared = ((globalThis as Record<symbol, unknown>)[Symbol.for('@little-workflow/world:worlds')] ??= {
  natives: new WeakMap<World, NativeWorld>(),
  wakers: new WeakMap<World, Set<Waker>>(),
}) as { natives: WeakMap<World, NativeWorld>; wakers: WeakMap<World, Set<Waker>> };
export const natives = shared.natives;
export const wakers = shared.wakers;

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
export function wakeSubscribers(world: World, streams?: string | ReadonlySet<string>): void {
  const set = wakers.get(world);
  if (set) for (const wake of [...set]) wake(streams);
}

export class OpenWorld implements World {
  readonly kind: 'local' | 'virtual' | 'postgres';
  readonly dataDir?: string;

  constructor(handle: NativeWorld) {
    this.kind = handle.kind as 'local' | 'virtual' | 'postgres';
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

export function handleOf(world: World): NativeWorld {
  const handle = natives.get(world);
  if (!handle) invalid('world', 'must be a World returned by localWorld(), virtualWorld() or postgresWorld()');
  return handle;
}

/** The native handle of an open world. A closed one says so before any argument is looked at. */
export function nativeOf(world: World): NativeWorld {
  const handle = handleOf(world);
  if (handle.closed) throw closedError();
  return handle;
}

/** Per local world, while it has subscribers: its live view (see `liveView` in live-view.ts). */
export const watchers = new WeakMap<World, Live>();

/**
 * A local world's live view, shared by its subscribers: how many there are and how many wait for
 * an event, a promise of its first look (its mark), and ways to keep the process alive while one
 * waits and to stop.
 */
export type Live = { subscribers: number; waiting: number; ready: Promise<void>; keepAlive: () => void; stop: () => void };

/**
 * Open (creating if needed) a world on disk: SQLite in WAL mode plus artifact files. With
 * `readOnly`, open an existing one for reading only.
 */
export function localWorld(opts?: LocalWorldOptions): World {
  const o = options(opts, 'localWorld options', ['dataDir', 'durability', 'pricing', 'readOnly', 'artifacts']);
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
  const s3 = s3Of(o.artifacts);
  checkNoOtherCopy(dataDir);
  const world = new OpenWorld(callSync(() => native.NativeWorld.openLocal(dataDir, durability, pricing, readOnly, s3)));
  claimDir(world, world.dataDir as string);
  return world;
}

/** Open a fresh world in memory: the same rules, nothing on disk. */
export function virtualWorld(opts?: VirtualWorldOptions): World {
  const o = options(opts, 'virtualWorld options', ['pricing']);
  const pricing = pricingText(o.pricing);
  return new OpenWorld(callSync(() => native.NativeWorld.openVirtual(pricing)));
}

/**
 * Open the world in a PostgreSQL database, which any number of processes on any number of hosts
 * may share. Nothing is connected until a call needs the server: a server that is down makes
 * calls reject with `WorldIoError` (naming host, port and database, never the password), and the
 * next call after it is back succeeds.
 */
export function postgresWorld(opts: PostgresWorldOptions): World {
  const o = options(opts, 'postgresWorld options', ['connectionString', 'schema', 'durability', 'pricing', 'lockLeaseMs', 'maxConnections', 'readOnly', 'artifacts']);
  const url = o.connectionString;
  if (typeof url !== 'string' || url.length === 0) invalid('connectionString', 'must be a non-empty string');
  if (o.schema !== undefined && typeof o.schema !== 'string') invalid('schema', 'must be a string');
  const durability = o.durability ?? 'full';
  if (typeof durability !== 'string') invalid('durability', "must be 'full' or 'normal'");
  for (const name of ['lockLeaseMs', 'maxConnections'] as const) {
    const v = o[name];
    if (v !== undefined && (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 1)) invalid(name, 'must be a positive safe integer');
  }
  const readOnly = o.readOnly ?? false;
  if (typeof readOnly !== 'boolean') invalid('readOnly', 'must be a boolean');
  const pricing = pricingText(o.pricing);
  const s3 = s3Of(o.artifacts);
  return new OpenWorld(
    callSync(() => native.NativeWorld.openPostgres(url, o.schema, durability, pricing, o.lockLeaseMs, o.maxConnections, readOnly, s3)),
  );
}
