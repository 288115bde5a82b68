/**
 * @little-workflow/world/vercel: a World for the Vercel Workflow SDK over this package's durable
 * event store. It serves the line of `@workflow/world` the app has installed (see
 * `lib/vercel/line.ts`): it declares that line's spec version and has that line's interface.
 *
 * One SDK run is one event log (`run_` + the SDK run id), each SDK event one envelope of type
 * `workflow.<eventType>`; every transition is checked against the state the log folds to and
 * committed only if no other writer appended since, so processes sharing a world never write a
 * duplicate or out-of-order event. Runs, hooks and correlation ids are found across runs through
 * indexes committed with the events. The queue and the streams are event logs too.
 */
import type { World as SdkWorld } from '@workflow/world';
import { DurableQueue } from './lib/vercel/queue.js';
import { installedLine } from './lib/vercel/line.js';
import { RunCache } from './lib/vercel/runs.js';
import { createStorage } from './lib/vercel/storage.js';
import { localWorld, postgresWorld, type World } from './lib/vercel/store.js';
import { createStreamer, createWorldLevelStreams } from './lib/vercel/streams.js';

/** Options of {@link createWorld}. */
export type VercelWorldOptions = {
  /** A world of this package to store in (closed by the caller, not by `close()`). */
  world?: World;
  /**
   * The data directory of a local world opened (and closed) by this World. Without this option
   * or `world`: a PostgreSQL world at `WORKFLOW_LITTLE_DATABASE_URL` when it is set, in the schema
   * `WORKFLOW_LITTLE_SCHEMA` (default `little_workflow`), so that the environment alone names one;
   * else a local world at `WORKFLOW_LITTLE_DATA_DIR`, else at `localWorld()`'s default
   * (`./.little-workflow`).
   */
  dataDir?: string;
  /** Where the app's workflow routes are; default `WORKFLOW_LOCAL_BASE_URL`, else `http://localhost:$PORT`. */
  baseUrl?: string;
  port?: number;
};

/** A World of the Workflow SDK, with an in-process handler hook as world-local has. */
export type VercelWorld = SdkWorld & {
  /** What the World does beyond the interface (read by the 5.x beta's runtime). */
  capabilities: { hookResumeDedup: boolean };
  registerHandler(prefix: string, handler: (req: Request) => Promise<Response>): void;
  /** Resume the queue's pending messages, and look for them every 5 s, also after a first look that failed. */
  start(): Promise<void>;
  /** Stop the queue and close the world if this World opened it. */
  close(): Promise<void>;
};

/** A World of the Workflow SDK storing in a world of this package. */
export function createWorld(options: VercelWorldOptions = {}): VercelWorld {
  const line = installedLine();
  const owned = options.world === undefined;
  const dataDir = options.dataDir ?? process.env.WORKFLOW_LITTLE_DATA_DIR;
  const databaseUrl = process.env.WORKFLOW_LITTLE_DATABASE_URL;
  const world =
    options.world ??
    (options.dataDir === undefined && databaseUrl
      ? postgresWorld({ connectionString: databaseUrl, schema: process.env.WORKFLOW_LITTLE_SCHEMA || undefined })
      : localWorld(dataDir ? { dataDir } : undefined));
  const cache = new RunCache(world, line);
  const queue = new DurableQueue(world, { baseUrl: options.baseUrl, port: options.port }, 'dpl_little-workflow');
  const storage = createStorage(world, cache);
  let closing: Promise<void> | undefined;
  return {
    specVersion: line.minted(),
    // `hook_received` writes with one resume id collapse onto the event the first committed.
    capabilities: { hookResumeDedup: true },
    processExitTriggersQueueRedelivery: false,
    ...storage,
    ...(line.worldLevelStreams ? createWorldLevelStreams(world) : { streams: createStreamer(world) }),
    getDeploymentId: queue.getDeploymentId,
    queue: queue.queue,
    createQueueHandler: queue.createQueueHandler,
    registerHandler: (prefix, handler) => queue.registerHandler(prefix, handler),
    start: () => queue.start(),
    close: () =>
      (closing ??= (async () => {
        await queue.close();
        if (owned) await world.close();
      })()),
  } as VercelWorld;
}

export default createWorld;
