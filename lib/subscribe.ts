// Subscriptions: a run's committed events, then each new one as it commits.
import { EventLogCorruptError, WorldClosedError, checkRunIdType, invalid } from './errors.js';
import type { EventEnvelope } from './envelopes.js';
import { listPacked } from './events.js';
import { isInstance, options } from './json.js';
import { SUBSCRIBE_POLL_MS, liveView } from './live-view.js';
import type { NativeWorld } from './native.js';
import { nativeOf, wakers, type Live, type Waker, type World } from './worlds.js';

/**
 * How often a subscriber of a virtual world, waiting for an event only this process can append,
 * looks again. Its timer keeps the process alive while it waits, as a live tail should.
 */
const VIRTUAL_POLL_MS = 1000;

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
  /**
   * The `eventId` of the event at `afterSequence`, as the caller last saw it. The first read then
   * checks that the store still holds that event there, and ends the subscription with
   * `EventLogCorruptError` if it does not (see {@link subscribe}).
   */
  afterEventId?: string;
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
 *
 * A subscription never joins two histories. A PostgreSQL store can lose commits it had
 * acknowledged (a server that crashed at `durability: 'normal'`, a failover to a replica that had
 * not received them), and then give their sequences to other events; and any run can be deleted
 * and started again under its id. So each read also reads the event last yielded. When the stream
 * this subscription followed holds no event at all any more, it was deleted, and the
 * subscription ends. When the store holds
 * another event at that sequence, or the stream is shorter, the subscription ends with
 * `EventLogCorruptError` naming the stream (`runId`), the `sequence` and the `eventId` it had
 * yielded: what was yielded from there on is no longer the stream's history, and the stream must
 * be read again. `afterEventId` has the first read make the same check of a position the caller
 * kept.
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
  /** The id of the event at `after`, when the next read is to check that it is still stored. */
  private lastId: string | undefined;
  private checkNext = false;
  /**
   * Whether the last event yielded may vanish while this process goes on: a PostgreSQL store can
   * forget commits it had acknowledged, and any world's run can be deleted. Set for every world.
   */
  private forgetful = false;
  /** Whether this subscription has yielded an event. */
  private yielded = false;
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
    const o = options(this.opts, 'subscribe options', ['afterSequence', 'afterEventId', 'signal']);
    const after = o.afterSequence ?? 0;
    if (!Number.isSafeInteger(after) || after < 0) invalid('afterSequence', 'must be a non-negative safe integer');
    const afterEventId = o.afterEventId;
    if (afterEventId !== undefined && typeof afterEventId !== 'string') invalid('afterEventId', 'must be a string');
    if (afterEventId !== undefined && after === 0) invalid('afterEventId', 'names the event at afterSequence, which must be given');
    const signal = o.signal;
    if (signal !== undefined && !isInstance(signal, AbortSignal)) invalid('signal', 'must be an AbortSignal');
    this.after = after;
    this.lastId = afterEventId;
    this.checkNext = afterEventId !== undefined;
    this.forgetful = true;
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
          this.yielded = true;
          if (this.forgetful) {
            this.lastId = next.eventId;
            this.checkNext = true;
          }
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
        // The read that checks the last event yielded starts with it.
        const check = this.checkNext && this.lastId !== undefined && this.after > 0;
        let page: { events: readonly EventEnvelope[]; units: number };
        try {
          page = await listPacked(nativeOf(this.world), this.streamId, check ? this.after - 1 : this.after, SUBSCRIBE_PAGE + (check ? 1 : 0), SUBSCRIBE_PAGE_UNITS);
        } catch (err) {
          if (err instanceof WorldClosedError) {
            this.finish();
            return DONE;
          }
          throw err;
        }
        let events = page.events;
        if (check) {
          const stored = events[0];
          if (stored === undefined && this.yielded && (await this.deleted())) {
            // The stream this subscription was following was deleted (`deleteRun`): nothing more
            // of it will come. (A position the caller kept, in a stream since deleted, is refused
            // below as any other that the store no longer holds.)
            this.finish();
            return DONE;
          }
          if (stored === undefined || stored.sequence !== this.after || stored.eventId !== this.lastId) throw this.forgotten(stored);
          events = events.slice(1);
        }
        // A page ended by its size may be followed by more at once, as a full one may.
        this.lastPageFull = events.length === SUBSCRIBE_PAGE || page.units >= SUBSCRIBE_PAGE_UNITS;
        // Checked again at every read where the store can forget, except the one right after a
        // page that the checked event filled alone (which would fill it again).
        this.checkNext = this.forgetful && !(check && events.length === 0 && page.units >= SUBSCRIBE_PAGE_UNITS);
        if (!this.finished) this.page = [...events];
      }
    } catch (err) {
      this.finish();
      throw err;
    }
  }

  /** Whether the stream holds no event at all: it was deleted since its last event was yielded. */
  private async deleted(): Promise<boolean> {
    const first = await listPacked(nativeOf(this.world), this.streamId, 0, 1, SUBSCRIBE_PAGE_UNITS);
    return first.events.length === 0;
  }

  /** The error ending a subscription whose last event yielded is no longer stored (`stored` is there instead). */
  private forgotten(stored: EventEnvelope | undefined): EventLogCorruptError {
    const there = stored?.sequence === this.after ? `holds ${stored.eventId} there` : 'no longer has that sequence';
    return new EventLogCorruptError(
      'EVENT_LOG_CORRUPT',
      `${this.streamId}: the event at sequence ${this.after} is no longer ${this.lastId}, which this subscription ` +
        `yielded; the store ${there}. It lost commits it had acknowledged (a PostgreSQL server that crashed at ` +
        "durability 'normal', or a failover to a replica that had not received them): read the stream again from the start",
      { runId: this.streamId, sequence: this.after, eventId: this.lastId, storedEventId: stored?.sequence === this.after ? stored.eventId : undefined },
    );
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
