// A durable queue: each message is an event log of its own (`run_wq_<messageId>`) holding its
// enqueueing and every delivery's outcome; the pending ones are in an index until their final
// event removes them. A delivery holds the message's run lock, so one process delivers it at a
// time, and a lock whose owner died is recovered: a crashed delivery is delivered again.
//
// A PostgreSQL store can lose commits it had acknowledged (a server that crashed at `durability:
// 'normal'`, a failover to a replica that had not received them). A lost outcome leaves its
// message pending, and it is delivered again. A lost enqueueing leaves nothing behind, so the
// process that enqueued keeps each message until it has seen it stored `SETTLED_MS` later, and
// enqueues it again if it is gone.
//
// A message for a run (a workflow message's `runId`, a step message's `workflowRunId`) names that
// run's log as its owner (`OWNER_INDEX`), so deleting or pruning the run deletes the message too.
// An owner must hold events: a message enqueued before its run is created (the SDK starts a run
// by enqueueing its first message beside the run_created) names its run in `adopt` instead, and
// each outcome recorded for it names the run its owner once the run is there. A message for a
// run deleted meanwhile is refused, one lost by the store is not enqueued again, and one delivered
// for a run that is not there (deleted since) is deleted too.
import { request as httpRequest } from 'node:http';
import { request as httpsRequest } from 'node:https';
import type { MessageId, Queue, QueuePayload, QueuePrefix, ValidQueueName } from '@workflow/world';
import { logOfRun, ulid } from './ids.js';
import { acquireRunLock, allIndexEntries, append, decode, deleteRun, encode, holdsEvents, indexConflictHolder, indexText, isOwnerMissing, isSequenceConflict, listEvents, lookupIndexEntry, ownerEntry, type IndexWrite, type RunLock, type World } from './store.js';

export const QUEUE_INDEX = {
  pending: 'workflow.queue.pending',
  idempotency: 'workflow.queue.idempotency',
} as const;

const T = {
  enqueued: 'workflow.queue.enqueued',
  deferred: 'workflow.queue.deferred',
  failed: 'workflow.queue.attempt_failed',
  delivered: 'workflow.queue.delivered',
} as const;

/** How often pending messages (of other processes too) are looked for. */
const SWEEP_MS = 5000;
/** How soon a message whose lease another process holds is looked at again. */
const LEASED_RETRY_MS = 1000;
/** How soon a delivery that never reached a handler (nothing listening yet) is tried again. */
const TRANSPORT_RETRY_MS = 1000;
/** Backoff after a handler failed: doubling from 1 s, at most 30 s. */
const BACKOFF_BASE_MS = 1000;
const BACKOFF_MAX_MS = 30_000;
/**
 * How long after its enqueueing a message is taken to be on the server's disk, where the store can
 * forget what it acknowledged: at `synchronous_commit=off` PostgreSQL flushes a commit within three
 * times its `wal_writer_delay` (200 ms by default, so 600 ms).
 */
const SETTLED_MS = 5000;
/** Longest timer Node allows; a later delivery time is reached in steps. */
const MAX_TIMER_MS = 2_147_483_647;

const QUEUE_NAME = /^(__(?:[a-z][a-z0-9]*_)?wkf_(workflow|step)_)(.+)$/;

export function queueLog(messageId: string): string {
  return `run_wq_${messageId}`;
}

/** The SDK run a message is for: a workflow message's `runId`, a step message's `workflowRunId`. */
function runOfMessage(message: unknown): string | undefined {
  if (typeof message !== 'object' || message === null) return undefined;
  const m = message as { runId?: unknown; workflowRunId?: unknown };
  const runId = typeof m.workflowRunId === 'string' ? m.workflowRunId : m.runId;
  return typeof runId === 'string' && runId !== '' ? runId : undefined;
}

/** A handler's answer: done, or deliver again after `timeoutSeconds`. */
type HandlerResult = void | { timeoutSeconds: number };
type Handler = (message: unknown, meta: { attempt: number; queueName: ValidQueueName; messageId: MessageId; requestId?: string }) => Promise<HandlerResult>;

export type QueueOptions = {
  /** Where the app's `/.well-known/workflow/v1/{flow,step}` routes are (default from the environment). */
  baseUrl?: string;
  port?: number;
};

/** What a message's log folds to. */
type MessageState = {
  queueName: string;
  body: unknown;
  headers: Record<string, string>;
  idempotencyKey?: string;
  /** The log of the run to name as owner once it exists, for a message enqueued before it. */
  adopt?: string;
  /** Deliveries that reached a handler. */
  deliveries: number;
  /** Not before this time (ms). */
  dueAt: number;
  final: boolean;
  lastSequence: number;
};

function foldMessage(events: readonly { type: string; sequence: number; payload: Readonly<Record<string, unknown>> }[]): MessageState | undefined {
  let s: MessageState | undefined;
  for (const e of events) {
    const p = e.payload;
    if (e.type === T.enqueued) {
      s = {
        queueName: p.queueName as string,
        body: p.body,
        headers: (p.headers as Record<string, string> | undefined) ?? {},
        idempotencyKey: p.idempotencyKey as string | undefined,
        adopt: p.adopt as string | undefined,
        deliveries: 0,
        dueAt: p.deliverAt as number,
        final: false,
        lastSequence: e.sequence,
      };
      continue;
    }
    if (s === undefined) continue;
    s.lastSequence = e.sequence;
    if (e.type === T.deferred) {
      s.deliveries = p.attempt as number;
      s.dueAt = p.deliverAt as number;
    } else if (e.type === T.failed) {
      s.deliveries = p.attempt as number;
      s.dueAt = p.retryAt as number;
    } else if (e.type === T.delivered) {
      s.deliveries = p.attempt as number;
      s.final = true;
    }
  }
  return s;
}

/** The base URL of the app's workflow routes, as world-local resolves it. */
function baseUrlOf(opts: QueueOptions): string | undefined {
  const basePath = ((globalThis as Record<symbol, unknown>)[Symbol.for('@workflow/core/basePath')] as string | undefined) ?? '';
  const origin = opts.baseUrl ?? process.env.WORKFLOW_LOCAL_BASE_URL;
  if (origin !== undefined) return origin;
  const port = opts.port ?? (process.env.PORT ? Number(process.env.PORT) : undefined);
  if (port === undefined || !Number.isFinite(port)) return undefined;
  return `http://localhost:${port}${basePath}`;
}

/** POST `body` to `url`; resolves with status and text, or rejects when no response came. */
function post(url: string, headers: Record<string, string>, body: string): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const u = new URL(url);
    const req = (u.protocol === 'https:' ? httpsRequest : httpRequest)(u, { method: 'POST', headers: { ...headers, 'content-length': String(Buffer.byteLength(body)) } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

export class DurableQueue {
  private readonly scheduled = new Map<string, NodeJS.Timeout | 'delivering'>();
  private readonly direct = new Map<string, (req: Request) => Promise<Response>>();
  private sweeper: NodeJS.Timeout | undefined;
  private closed = false;
  /** Deliveries under way, which `close()` lets finish and record their outcome. */
  private readonly inFlight = new Set<Promise<void>>();
  /**
   * Messages this process enqueued in a store that can forget acknowledged commits, until they are
   * seen stored `SETTLED_MS` after: what their enqueueing wrote, to write it again if it is lost.
   */
  private readonly unsettled = new Map<string, { payload: Record<string, unknown>; index: IndexWrite[]; timer?: NodeJS.Timeout }>();

  constructor(
    private readonly world: World,
    private readonly opts: QueueOptions,
    private readonly deploymentId: string,
  ) {}

  getDeploymentId = async (): Promise<string> => this.deploymentId;

  queue = async (queueName: ValidQueueName, message: QueuePayload, opts?: { idempotencyKey?: string; headers?: Record<string, string>; delaySeconds?: number }): Promise<{ messageId: MessageId | null }> => {
    const m = QUEUE_NAME.exec(queueName);
    if (!m) throw new Error(`Invalid queue name: ${queueName}`);
    const key = opts?.idempotencyKey;
    if (key !== undefined) {
      const held = await lookupIndexEntry(this.world, QUEUE_INDEX.idempotency, indexText(key));
      if (held !== undefined) return { messageId: held.value as MessageId };
    }
    const messageId = `msg_${ulid()}`;
    const log = queueLog(messageId);
    const body = await encode(message, { world: this.world, runId: log, name: 'body' });
    const deliverAt = Date.now() + Math.max(0, (opts?.delaySeconds ?? 0) * 1000);
    const index: IndexWrite[] = [{ index: QUEUE_INDEX.pending, key: messageId, value: queueName }];
    if (key !== undefined) index.push({ index: QUEUE_INDEX.idempotency, key: indexText(key), value: messageId });
    const run = runOfMessage(message);
    const owned = run !== undefined && (await holdsEvents(this.world, logOfRun(run)));
    if (owned) index.push(ownerEntry(log, logOfRun(run)));
    const adopt = run !== undefined && !owned ? { adopt: logOfRun(run) } : {};
    const payload = { queueName, body, deliverAt, ...(opts?.headers ? { headers: opts.headers } : {}), ...(key !== undefined ? { idempotencyKey: key } : {}), ...adopt };
    try {
      await append(this.world, log, { type: T.enqueued, payload, expectedSequence: 0, index });
    } catch (err) {
      // Another enqueue holds the key: that message is this one.
      if (key !== undefined && indexConflictHolder(err) !== undefined) {
        const held = await lookupIndexEntry(this.world, QUEUE_INDEX.idempotency, indexText(key));
        if (held !== undefined) return { messageId: held.value as MessageId };
      }
      throw err;
    }
    if (this.world.kind === 'postgres') this.settleLater(messageId, { payload, index });
    this.schedule(messageId, deliverAt);
    return { messageId: messageId as MessageId };
  };

  createQueueHandler = (prefix: QueuePrefix, handler: Handler): ((req: Request) => Promise<Response>) => {
    return async (req: Request) => {
      const queueName = req.headers.get('x-vqs-queue-name');
      const messageId = req.headers.get('x-vqs-message-id');
      const attempt = Number(req.headers.get('x-vqs-message-attempt'));
      if (!queueName || !QUEUE_NAME.test(queueName) || !messageId || !Number.isSafeInteger(attempt)) {
        return Response.json({ error: 'Missing required headers' }, { status: 400 });
      }
      if (!queueName.startsWith(prefix)) return Response.json({ error: 'Unhandled queue' }, { status: 400 });
      try {
        const body = await decode(JSON.parse(await req.text()), this.world);
        const result = await handler(body, { attempt, queueName: queueName as ValidQueueName, messageId: messageId as MessageId });
        if (result && typeof result.timeoutSeconds === 'number') return Response.json({ timeoutSeconds: result.timeoutSeconds });
        return Response.json({ ok: true });
      } catch (err) {
        return Response.json(String(err), { status: 500 });
      }
    };
  };

  /** Deliver messages of queues with `prefix` to `handler` in this process instead of over HTTP. */
  registerHandler(prefix: string, handler: (req: Request) => Promise<Response>): void {
    this.direct.set(prefix, handler);
  }

  /**
   * Resume every pending message, and keep looking for ones other processes leave pending. The
   * looking goes on when the first look fails (its error rejects this call): a store that cannot
   * be reached at start is caught up with once it can.
   */
  async start(): Promise<void> {
    if (this.sweeper === undefined && !this.closed) {
      this.sweeper = setInterval(() => void this.sweep().catch(() => {}), SWEEP_MS);
      this.sweeper.unref();
    }
    await this.sweep();
  }

  async close(): Promise<void> {
    this.closed = true;
    if (this.sweeper !== undefined) clearInterval(this.sweeper);
    for (const u of this.unsettled.values()) clearTimeout(u.timer);
    this.unsettled.clear();
    for (const t of this.scheduled.values()) if (t !== 'delivering') clearTimeout(t);
    this.scheduled.clear();
    await Promise.allSettled([...this.inFlight]);
  }

  private async sweep(): Promise<void> {
    for (const entry of await allIndexEntries(this.world, QUEUE_INDEX.pending)) {
      if (!this.scheduled.has(entry.key)) this.schedule(entry.key, Date.now());
    }
  }

  /** Look at the message at `at` (ms), once: a message scheduled already keeps its time. */
  private schedule(messageId: string, at: number, replace = false): void {
    if (this.closed) return;
    const prev = this.scheduled.get(messageId);
    if (prev !== undefined && !replace) return;
    if (prev !== undefined && prev !== 'delivering') clearTimeout(prev);
    const delay = Math.min(Math.max(0, at - Date.now()), MAX_TIMER_MS);
    const timer = setTimeout(() => {
      this.scheduled.set(messageId, 'delivering');
      const delivery = this.attempt(messageId).then(
        (next) => {
          this.scheduled.delete(messageId);
          if (next !== undefined) this.schedule(messageId, next);
        },
        (err: unknown) => {
          this.scheduled.delete(messageId);
          if (this.closed) return;
          console.error('[little-workflow] queue delivery failed, retrying', { messageId, error: String(err) });
          this.schedule(messageId, Date.now() + TRANSPORT_RETRY_MS);
        },
      );
      this.inFlight.add(delivery);
      void delivery.finally(() => this.inFlight.delete(delivery));
    }, delay);
    this.scheduled.set(messageId, timer);
  }

  /** Keep what enqueued `messageId` until it is seen stored `SETTLED_MS` from now. */
  private settleLater(messageId: string, enqueued: { payload: Record<string, unknown>; index: IndexWrite[] }, after = SETTLED_MS): void {
    if (this.closed) return;
    const timer = setTimeout(() => void this.settle(messageId), after);
    timer.unref();
    this.unsettled.set(messageId, { ...enqueued, timer });
  }

  /** Forget a message seen stored; enqueue one that is gone again, and look again later. */
  private async settle(messageId: string): Promise<void> {
    const kept = this.unsettled.get(messageId);
    if (kept === undefined || this.closed) return;
    try {
      const stored = await listEvents(this.world, queueLog(messageId), { limit: 1 });
      if (stored.length > 0) {
        this.unsettled.delete(messageId);
        return;
      }
      if (await this.enqueueAgain(messageId)) this.schedule(messageId, kept.payload.deliverAt as number);
    } catch {
      // The store cannot be reached: look again at the next sweep.
      this.settleLater(messageId, kept, SWEEP_MS);
    }
  }

  /**
   * Write the enqueueing of a message this process enqueued and the store lost, as it was, and keep
   * it until that is seen stored in turn; false when its idempotency key has gone to another
   * message meanwhile (that message is this one).
   */
  private async enqueueAgain(messageId: string): Promise<boolean> {
    const kept = this.unsettled.get(messageId);
    if (kept === undefined) return false;
    try {
      await append(this.world, queueLog(messageId), { type: T.enqueued, payload: kept.payload, expectedSequence: 0, index: kept.index });
      console.error('[little-workflow] queue message lost by the store, enqueued again', { messageId, queueName: kept.payload.queueName });
      clearTimeout(kept.timer);
      this.settleLater(messageId, kept);
      return true;
    } catch (err) {
      if (isSequenceConflict(err)) return true; // written again already
      // Another message holds its key (that message is this one), or its run was deleted.
      if (indexConflictHolder(err) !== undefined || isOwnerMissing(err)) {
        clearTimeout(kept.timer);
        this.unsettled.delete(messageId);
        return false;
      }
      throw err;
    }
  }

  /** One look at a message: deliver it if due and not leased elsewhere. Resolves with when to look again. */
  private async attempt(messageId: string): Promise<number | undefined> {
    const log = queueLog(messageId);
    let orphaned = false;
    let lock: RunLock;
    try {
      lock = await acquireRunLock(this.world, log, { waitMs: 0 });
    } catch (err) {
      if ((err as { code?: unknown }).code === 'RUN_LOCKED') return Date.now() + LEASED_RETRY_MS;
      throw err;
    }
    try {
      const state = foldMessage(await listEvents(this.world, log));
      // Enqueued here and lost by the store: enqueued again, and looked at again at once.
      if (state === undefined && this.unsettled.has(messageId)) return (await this.enqueueAgain(messageId)) ? Date.now() : undefined;
      if (state === undefined || state.final) return undefined;
      if (state.dueAt > Date.now()) return state.dueAt;
      const attempt = state.deliveries + 1;
      let outcome: { status: number; text: string };
      try {
        outcome = await this.deliver(messageId, state, attempt);
      } catch {
        // Nothing answered (the app is not listening yet): not a delivery, so no attempt is counted.
        return Date.now() + TRANSPORT_RETRY_MS;
      }
      const now = Date.now();
      if (outcome.status >= 200 && outcome.status < 300) {
        let timeoutSeconds: number | undefined;
        try {
          const t = Number((JSON.parse(outcome.text) as { timeoutSeconds?: unknown }).timeoutSeconds);
          if (Number.isFinite(t) && t >= 0) timeoutSeconds = t;
        } catch {
          timeoutSeconds = undefined;
        }
        if (timeoutSeconds !== undefined) {
          const deliverAt = now + timeoutSeconds * 1000;
          await this.record(log, state, { type: T.deferred, payload: { attempt, deliverAt } });
          return deliverAt;
        }
        const index: { index: string; key: string; value: null }[] = [{ index: QUEUE_INDEX.pending, key: messageId, value: null }];
        if (state.idempotencyKey !== undefined) index.push({ index: QUEUE_INDEX.idempotency, key: indexText(state.idempotencyKey), value: null });
        await this.record(log, state, { type: T.delivered, payload: { attempt }, index });
        // Delivered for a run that is not there (deleted since it was enqueued): nothing keeps it.
        orphaned = state.adopt !== undefined && !(await holdsEvents(this.world, state.adopt));
        return undefined;
      }
      console.error(`[little-workflow] queue message failed (attempt ${attempt}, HTTP ${outcome.status})`, { messageId, queueName: state.queueName, handlerError: outcome.text });
      const retryAt = now + Math.min(BACKOFF_BASE_MS * 2 ** (attempt - 1), BACKOFF_MAX_MS);
      await this.record(log, state, { type: T.failed, payload: { attempt, retryAt, status: outcome.status } });
      return retryAt;
    } finally {
      await lock.release().catch(() => {});
      if (orphaned) await deleteRun(this.world, log).catch(() => {});
    }
  }

  /** Append a delivery's outcome; under the lease no other writer appends, so a conflict is a bug to surface. */
  private async record(log: string, state: MessageState, e: { type: string; payload: Record<string, unknown>; index?: IndexWrite[] }): Promise<void> {
    // A message enqueued before its run names the run its owner as soon as the run is there.
    const adopting = state.adopt !== undefined && (await holdsEvents(this.world, state.adopt));
    const owner = adopting ? [ownerEntry(log, state.adopt as string)] : [];
    try {
      try {
        await append(this.world, log, { ...e, index: [...(e.index ?? []), ...owner], expectedSequence: state.lastSequence });
      } catch (err) {
        // The run was deleted since it was looked for: the outcome is recorded all the same.
        if (!adopting || !isOwnerMissing(err)) throw err;
        await append(this.world, log, { ...e, expectedSequence: state.lastSequence });
      }
    } catch (err) {
      if (isSequenceConflict(err)) throw new Error(`queue message ${log} was written to while leased`, { cause: err });
      throw err;
    }
  }

  private async deliver(messageId: string, state: MessageState, attempt: number): Promise<{ status: number; text: string }> {
    const m = QUEUE_NAME.exec(state.queueName) as RegExpExecArray;
    const prefix = m[1];
    const route = m[2] === 'workflow' ? 'flow' : 'step';
    const headers: Record<string, string> = {
      ...state.headers,
      'content-type': 'application/json',
      'x-vqs-queue-name': state.queueName,
      'x-vqs-message-id': messageId,
      'x-vqs-message-attempt': String(attempt),
    };
    const body = JSON.stringify(state.body);
    const direct = this.direct.get(prefix);
    const base = baseUrlOf(this.opts);
    if (direct !== undefined) {
      const url = `${base ?? 'http://localhost'}/.well-known/workflow/v1/${route}`;
      const res = await direct(new Request(url, { method: 'POST', headers, body }));
      return { status: res.status, text: await res.text() };
    }
    if (base === undefined) throw new Error('no base URL for the workflow routes: set PORT or WORKFLOW_LOCAL_BASE_URL');
    return post(`${base.replace(/\/+$/, '')}/.well-known/workflow/v1/${route}`, headers, body);
  }
}

export type { Queue };
