// The SDK's streams: each stream an event log of its own (`run_ws_…`), a chunk per event, then a
// closing event. Chunk i is the event of sequence i + 1. Readers follow the log live through
// `subscribe`, so they never list it again; the streams of a run are found through an index.
// Later lines know a stream by its run and its name (`world.streams`); the 4.x line by its name
// alone, a unique id, through methods of the World itself. A stream's log names its run's log as
// its owner (`OWNER_INDEX`), so deleting or pruning the run deletes the stream with it; a write
// for a run deleted meanwhile (a step still running then) is refused, and leaves no log behind.
import { createHash } from 'node:crypto';
import type { Streamer } from '@workflow/world';
import { WorkflowWorldError } from './errors.js';
import { logOfRun } from './ids.js';
import { allIndexEntries, append, decode, deleteRun, encode, holdsEvents, isOwnerMissing, listEvents, ownerEntry, subscribe, type EventEnvelope, type IndexWrite, type World } from './store.js';

export const STREAM_INDEX = 'workflow.stream';

const CHUNK = 'workflow.stream.chunk';
const CLOSED = 'workflow.stream.closed';

/** The log of a run's stream. */
export function streamLog(runId: string, name: string): string {
  return `run_ws_${createHash('sha256').update(`${runId}\n${name}`).digest('hex').slice(0, 32)}`;
}

/** The log of a stream known by its name alone (the 4.x line's stream names are unique ids). */
export function namedStreamLog(name: string): string {
  return `run_ws_${createHash('sha256').update(`\u0000named\n${name}`).digest('hex').slice(0, 32)}`;
}

function bytesOf(chunk: string | Uint8Array): Uint8Array {
  return typeof chunk === 'string' ? new TextEncoder().encode(chunk) : chunk;
}

/** The streams of `world`, each in the log `logOf` names. */
export function createStreamer(world: World, logOf: (runId: string, name: string) => string = streamLog): Required<Pick<Streamer['streams'], 'writeMulti'>> & Streamer['streams'] {
  /** Streams this process has indexed already, each with the sequence of the event that did. */
  const indexed = new Map<string, number>();
  /** Whether the store can forget commits it had acknowledged (see `indexedBy`). */
  const forgetful = world.kind === 'postgres';

  /**
   * Note what an append to the stream `key` says of its index entry. An append at or before the
   * sequence of the one that wrote the entry means the store forgot that one (a PostgreSQL server
   * that crashed at `durability: 'normal'`), and the entry with it: the next append writes it again.
   */
  function indexedBy(key: string, sequence: number, wroteIndex: boolean): void {
    if (wroteIndex) indexed.set(key, sequence);
    else if (sequence <= (indexed.get(key) ?? 0)) indexed.delete(key);
  }

  /** The entries that file the stream `key` (in the log `log`) under its run, and name the run's log its owner. */
  function entriesOf(log: string, key: string, runId: string): IndexWrite[] {
    const entries: IndexWrite[] = [{ index: STREAM_INDEX, key, value: runId }];
    if (runId !== '') entries.push(ownerEntry(log, logOfRun(runId)));
    return entries;
  }

  async function write(runIdArg: string | Promise<string>, name: string, chunk: string | Uint8Array): Promise<void> {
    const runId = await runIdArg;
    const log = logOf(runId, name);
    const data = await encode(bytesOf(chunk), { world, runId: log, name: 'chunk' });
    await appendFiled(runId, name, log, CHUNK, { data }, false);
  }

  /**
   * Append to the stream `name` of `runId`, filing it under its run (and naming the run's log its
   * owner) unless this process did already; `refile` files it again all the same. Refused when
   * the run was deleted: a first append is refused by the store, and a later one that finds the
   * log emptied removes what it wrote again.
   */
  async function appendFiled(runId: string, name: string, log: string, type: string, payload: Record<string, unknown>, refile: boolean): Promise<void> {
    const key = `${runId}\n${name}`;
    const index = indexed.has(key) && !refile ? undefined : entriesOf(log, key, runId);
    let env: EventEnvelope;
    try {
      env = await append(world, log, { type, payload, index });
    } catch (err) {
      if (isOwnerMissing(err)) throw runDeleted(runId, name);
      throw err;
    }
    const emptied = index === undefined && env.sequence <= (indexed.get(key) ?? 0);
    indexedBy(key, env.sequence, index !== undefined);
    if (emptied && runId !== '' && !(await holdsEvents(world, logOfRun(runId)))) {
      await deleteRun(world, log);
      throw runDeleted(runId, name);
    }
  }

  function runDeleted(runId: string, name: string): Error {
    return new WorkflowWorldError(`stream "${name}" was not written: run "${runId}" was deleted`, { status: 410 });
  }

  async function chunkOf(env: EventEnvelope): Promise<Uint8Array> {
    return (await decode(env.payload.data, world)) as Uint8Array;
  }

  /** The stream's chunk count and whether it is closed, from its log. */
  async function infoOf(log: string): Promise<{ chunks: number; done: boolean }> {
    const events = await listEvents(world, log);
    let chunks = 0;
    for (const e of events) {
      if (e.type === CLOSED) return { chunks, done: true };
      if (e.type === CHUNK) chunks++;
    }
    return { chunks, done: false };
  }

  return {
    write,
    async writeMulti(runId: string, name: string, chunks: (string | Uint8Array)[]) {
      for (const c of chunks) await write(runId, name, c);
    },
    async close(runIdArg: string, name: string) {
      const runId = await runIdArg;
      // Where the store can forget, the last event of a stream writes its entry again.
      await appendFiled(runId, name, logOf(runId, name), CLOSED, {}, forgetful);
    },
    async get(runIdArg: string, name: string, startIndex = 0) {
      const runId = await runIdArg;
      const log = logOf(runId, name);
      let start = startIndex;
      if (start < 0) start = Math.max(0, (await infoOf(log)).chunks + start);
      const abort = new AbortController();
      const events = subscribe(world, log, { afterSequence: start, signal: abort.signal });
      return new ReadableStream<Uint8Array>({
        async pull(controller) {
          for (;;) {
            const next = await events.next();
            if (next.done || next.value.type === CLOSED) {
              abort.abort();
              controller.close();
              return;
            }
            if (next.value.type !== CHUNK) continue;
            controller.enqueue(await chunkOf(next.value));
            return;
          }
        },
        cancel() {
          abort.abort();
        },
      });
    },
    async list(runId: string) {
      const entries = await allIndexEntries(world, STREAM_INDEX, runId);
      return entries.map((e) => e.key.slice(runId.length + 1));
    },
    async getChunks(runIdArg: string, name: string, options?: { limit?: number; cursor?: string }) {
      const runId = await runIdArg;
      const log = logOf(runId, name);
      const limit = Math.min(Math.max(options?.limit ?? 100, 1), 1000);
      const after = options?.cursor !== undefined ? Number(options.cursor) || 0 : 0;
      const events = await listEvents(world, log, { afterSequence: after, limit: limit + 1 });
      const data: { index: number; data: Uint8Array }[] = [];
      let done = false;
      let hasMore = false;
      for (const e of events) {
        if (e.type === CLOSED) {
          done = true;
          break;
        }
        if (e.type !== CHUNK) continue;
        if (data.length === limit) {
          hasMore = true;
          break;
        }
        data.push({ index: e.sequence - 1, data: await chunkOf(e) });
      }
      const last = data[data.length - 1];
      return { data, cursor: hasMore && last ? String(last.index + 1) : null, hasMore, done };
    },
    async getInfo(runIdArg: string, name: string) {
      const runId = await runIdArg;
      const { chunks, done } = await infoOf(logOf(runId, name));
      return { tailIndex: chunks - 1, done };
    },
  };
}

/** The World-level stream methods of the 4.x line, a stream known by its name alone. */
export type WorldLevelStreams = {
  writeToStream(name: string, runId: string | Promise<string>, chunk: string | Uint8Array): Promise<void>;
  writeToStreamMulti(name: string, runId: string | Promise<string>, chunks: (string | Uint8Array)[]): Promise<void>;
  closeStream(name: string, runId: string | Promise<string>): Promise<void>;
  readFromStream(name: string, startIndex?: number): Promise<ReadableStream<Uint8Array>>;
  listStreamsByRunId(runId: string): Promise<string[]>;
  getStreamChunks(name: string, runId: string, options?: { limit?: number; cursor?: string }): ReturnType<Streamer['streams']['getChunks']>;
  getStreamInfo(name: string, runId: string): ReturnType<Streamer['streams']['getInfo']>;
};

/**
 * The streams of `world` as the 4.x line's World methods: arguments `(name, runId)`, and a
 * stream's log named by its name alone, since `readFromStream` is given no run. The run still
 * files the stream in the index `listStreamsByRunId` reads.
 */
export function createWorldLevelStreams(world: World): WorldLevelStreams {
  const s = createStreamer(world, (_runId, name) => namedStreamLog(name));
  // `runId` may be a promise of it (the runtime passes one while the run is being created).
  const run = (runId: string | Promise<string>) => runId as string;
  return {
    writeToStream: (name, runId, chunk) => s.write(run(runId), name, chunk),
    writeToStreamMulti: (name, runId, chunks) => s.writeMulti(run(runId), name, chunks),
    closeStream: (name, runId) => s.close(run(runId), name),
    readFromStream: (name, startIndex) => s.get('', name, startIndex),
    listStreamsByRunId: (runId) => s.list(runId),
    getStreamChunks: (name, runId, options) => s.getChunks(runId, name, options),
    getStreamInfo: (name, runId) => s.getInfo(runId, name),
  };
}
