// Reading the index entries that appends write with their events (see `AppendEventInput.index`).
import { call, invalid, wellFormed } from './errors.js';
import { frozen, options } from './json.js';
import { nativeOf, type World } from './worlds.js';

/** An index entry as committed: its value, and the run and event that last wrote it. */
export interface IndexEntry {
  readonly index: string;
  readonly key: string;
  readonly value: string;
  readonly runId: string;
  readonly sequence: number;
}

/** Options of {@link listIndexEntries}. */
export interface ListIndexEntriesOptions {
  /** Only entries with this value. */
  value?: string;
  /** Only entries whose key comes after this one in the listing's order. */
  after?: string;
  /** At most this many entries: 1 to 10000, default 100. */
  limit?: number;
  /** By key ascending (default) or descending, comparing keys' UTF-8 bytes. */
  order?: 'asc' | 'desc';
}

function text(name: string, value: unknown): string {
  if (typeof value !== 'string') invalid(name, 'must be a string');
  wellFormed(name, value);
  return value;
}

/** Entry `key` of `index`, or `undefined` when there is none. */
export async function lookupIndexEntry(world: World, index: string, key: string): Promise<IndexEntry | undefined> {
  const handle = nativeOf(world);
  const [i, k] = [text('index', index), text('key', key)];
  return frozen<IndexEntry | null>(await call(() => handle.indexEntry(i, k))) ?? undefined;
}

/** Entries of `index`, by key, a page at a time: pass the last key of a page as the next one's `after`. */
export async function listIndexEntries(world: World, index: string, opts?: ListIndexEntriesOptions): Promise<readonly IndexEntry[]> {
  const handle = nativeOf(world);
  const i = text('index', index);
  const o = options(opts, 'listIndexEntries options', ['value', 'after', 'limit', 'order']);
  const value = o.value === undefined ? undefined : text('value', o.value);
  const after = o.after === undefined ? undefined : text('after', o.after);
  const limit = o.limit ?? 100;
  if (typeof limit !== 'number' || !Number.isSafeInteger(limit) || limit < 1 || limit > 10_000) invalid('limit', 'must be an integer from 1 to 10000');
  const order = o.order ?? 'asc';
  if (order !== 'asc' && order !== 'desc') invalid('order', "must be 'asc' or 'desc'");
  return frozen<readonly IndexEntry[]>(await call(() => handle.indexEntries(i, value, after, limit, order === 'desc')));
}
