// The calls the Vercel adapter makes into this package, and the JSON form of SDK values in our
// payloads: bytes inline as base64 (or as an artifact when large), dates as ISO strings.
import { createHash } from 'node:crypto';
import { types } from 'node:util';
import { listEvents as listEventsOf, listIndexEntries, readArtifact, writeArtifact, type EventEnvelope, type IndexEntry, type IndexWrite, type RunLock, type World } from '../../world.js';

export type { EventEnvelope, IndexEntry, IndexWrite, RunLock, World };
export { acquireRunLock, appendEvent as append, appendEvents, deleteRun, listEvents, listIndexEntries, localWorld, lookupIndexEntry, postgresWorld, subscribe } from '../../world.js';

/** Longest SDK text kept as is in an index key or value; the store takes 1,024 bytes. */
const INDEX_TEXT_MAX_BYTES = 900;

/**
 * An SDK-supplied text (a hook token, a correlation id, a workflow name, a queue idempotency key)
 * as an index key or value: itself when it fits the store's limits, else U+0001 and its sha256.
 * Whoever reads an entry through it compares the real text from the run's log.
 */
export function indexText(text: string): string {
  if (text.length > 0 && Buffer.byteLength(text) <= INDEX_TEXT_MAX_BYTES && !text.includes('\0') && text.isWellFormed()) return text;
  return `\u0001sha256:${createHash('sha256').update(text).digest('hex')}`;
}

/** Every entry of an index (with `value`, only those), a page at a time. */
export async function allIndexEntries(world: World, index: string, value?: string): Promise<IndexEntry[]> {
  const out: IndexEntry[] = [];
  let after: string | undefined;
  for (;;) {
    const page = await listIndexEntries(world, index, { value, after, limit: 1000, order: 'asc' });
    out.push(...page);
    if (page.length < 1000) return out;
    after = page[page.length - 1].key;
  }
}

/**
 * The index through which a stream log names the run log that owns it: deleting or pruning that
 * run deletes the stream with it. Only the stream itself writes its entry, keyed by its own id.
 */
export const OWNER_INDEX = 'little.owner';

/** The entry by which the log `log` names `runLog` as its owner. */
export function ownerEntry(log: string, runLog: string): IndexWrite {
  return { index: OWNER_INDEX, key: log, value: runLog };
}

/** Whether `err` is the rejection of an append whose `expectedSequence` was not the run's last. */
export function isSequenceConflict(err: unknown): boolean {
  return (err as { code?: unknown } | null)?.code === 'EVENT_SEQUENCE_CONFLICT';
}

/** Whether `err` refuses an owner entry (see {@link ownerEntry}) because its run holds no events: it was deleted, or not yet created. */
export function isOwnerMissing(err: unknown): boolean {
  const e = err as { code?: unknown; details?: Record<string, unknown> } | null;
  const path = (err as { path?: unknown } | null)?.path ?? e?.details?.path;
  return e?.code === 'EVENT_VALIDATION' && /^index\[\d+\]\.value$/.test(String(path)) && /owner/.test(String((err as Error).message));
}

/** Whether the run `runLog` holds events. */
export async function holdsEvents(world: World, runLog: string): Promise<boolean> {
  return (await listEventsOf(world, runLog, { limit: 1 })).length > 0;
}

/** Whether `err` is the rejection of an index write to an entry another run holds; its holder. */
export function indexConflictHolder(err: unknown): { holderRunId?: string } | undefined {
  const e = err as { code?: unknown; details?: Record<string, unknown> } | null;
  if (e?.code !== 'INDEX_ENTRY_CONFLICT') return undefined;
  const holder = e.details?.holderRunId;
  return { holderRunId: typeof holder === 'string' ? holder : undefined };
}

/** Binary values at least this long are stored as artifacts rather than inline. */
export const INLINE_BYTES_MAX = 64 * 1024;

const MARKERS = new Set(['$bytes', '$artifact', '$date', '$esc']);

/** Where encoded values that become artifacts are filed. */
export type ArtifactHome = { world: World; runId: string; name: string };

/**
 * `value` as plain JSON: a Uint8Array becomes `{"$bytes": base64}` (or `{"$artifact": ref}` when
 * large), a Date `{"$date": iso}`, an `undefined` field is left out (`null` in an array), and an
 * object that could be read as one of these is wrapped in `{"$esc": …}`.
 */
export async function encode(value: unknown, home: ArtifactHome): Promise<unknown> {
  if (value === null || typeof value === 'string' || typeof value === 'boolean' || typeof value === 'number') return value;
  if (value === undefined) return null;
  // util.types knows a Uint8Array or a Date of any realm (a Buffer in a test runner's `vm` context
  // is Node's); instanceof, a Proxy of one.
  if (types.isUint8Array(value) || value instanceof Uint8Array) {
    if (value.byteLength < INLINE_BYTES_MAX) return { $bytes: Buffer.from(value.buffer, value.byteOffset, value.byteLength).toString('base64') };
    const manifest = await writeArtifact(home.world, {
      runId: home.runId,
      stepPath: 'workflow',
      name: home.name,
      contentType: 'application/octet-stream',
      encoding: 'bytes',
      payload: value,
    });
    return { $artifact: manifest.artifactRef };
  }
  if (types.isDate(value) || value instanceof Date) return { $date: value.toISOString() };
  if (Array.isArray(value)) {
    const out: unknown[] = [];
    for (const v of value) out.push(await encode(v, home));
    return out;
  }
  if (typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
      if (v === undefined) continue;
      defineField(out, k, await encode(v, home));
    }
    const keys = Object.keys(out);
    return keys.length === 1 && MARKERS.has(keys[0]) ? { $esc: out } : out;
  }
  throw new TypeError(`cannot store a ${typeof value}`);
}

/** The fields an `{"$esc": …}` wrapper holds (which are values, never markers), or undefined. */
function escaped(o: Record<string, unknown>): Record<string, unknown> | undefined {
  const keys = Object.keys(o);
  return keys.length === 1 && keys[0] === '$esc' && o.$esc !== null && typeof o.$esc === 'object' ? (o.$esc as Record<string, unknown>) : undefined;
}

/** Whether an encoded value holds an artifact reference (and so needs the world to decode). */
function holdsArtifact(value: unknown): boolean {
  if (value === null || typeof value !== 'object') return false;
  if (Array.isArray(value)) return value.some(holdsArtifact);
  const o = value as Record<string, unknown>;
  if (typeof o.$artifact === 'string' && Object.keys(o).length === 1) return true;
  return Object.values(escaped(o) ?? o).some(holdsArtifact);
}

/** The value {@link encode} was given (artifacts read and verified from `world`). */
export async function decode(value: unknown, world: World): Promise<unknown> {
  if (!holdsArtifact(value)) return decodeSync(value, undefined);
  const blobs = new Map<string, Uint8Array>();
  await collectArtifacts(value, world, blobs);
  return decodeSync(value, blobs);
}

async function collectArtifacts(value: unknown, world: World, blobs: Map<string, Uint8Array>): Promise<void> {
  if (value === null || typeof value !== 'object') return;
  if (Array.isArray(value)) {
    for (const v of value) await collectArtifacts(v, world, blobs);
    return;
  }
  const o = value as Record<string, unknown>;
  if (typeof o.$artifact === 'string' && Object.keys(o).length === 1) {
    if (!blobs.has(o.$artifact)) {
      const { payload } = await readArtifact(world, o.$artifact);
      blobs.set(o.$artifact, Uint8Array.from(payload as Buffer));
    }
    return;
  }
  for (const v of Object.values(escaped(o) ?? o)) await collectArtifacts(v, world, blobs);
}

/** {@link decode} of a value whose artifacts (if any) are already read into `blobs`. */
export function decodeSync(value: unknown, blobs: Map<string, Uint8Array> | undefined): unknown {
  if (value === null || typeof value !== 'object') return value;
  if (Array.isArray(value)) return value.map((v) => decodeSync(v, blobs));
  const o = value as Record<string, unknown>;
  const keys = Object.keys(o);
  if (keys.length === 1) {
    const k = keys[0];
    if (k === '$bytes' && typeof o.$bytes === 'string') return Uint8Array.from(Buffer.from(o.$bytes, 'base64'));
    if (k === '$date' && typeof o.$date === 'string') return new Date(o.$date);
    if (k === '$artifact' && typeof o.$artifact === 'string') {
      const blob = blobs?.get(o.$artifact);
      if (blob === undefined) throw new Error(`artifact ${o.$artifact} was not read`);
      return Uint8Array.from(blob);
    }
    const inner = escaped(o);
    if (inner !== undefined) {
      const out: Record<string, unknown> = {};
      for (const [ik, iv] of Object.entries(inner)) defineField(out, ik, decodeSync(iv, blobs));
      return out;
    }
  }
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(o)) defineField(out, k, decodeSync(v, blobs));
  return out;
}

/**
 * Set `o[k]` as an own field. Assigned, a `__proto__` key would set the object's prototype
 * instead of adding the field, and the value would be lost without an error.
 */
export function defineField(o: Record<string, unknown>, k: string, v: unknown): void {
  Object.defineProperty(o, k, { value: v, enumerable: true, writable: true, configurable: true });
}
