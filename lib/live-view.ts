// The live view of a world other processes write: one watcher of its log files (or of its
// database's notifications), shared by its subscriptions.
import { watch, type FSWatcher } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as after, clearTimeout as cancel } from 'node:timers';
import type { NativeWorld } from './native.js';
import { wakeSubscribers, watchers, type Live, type World } from './worlds.js';

/**
 * How often a world with subscribers is asked what other processes committed, should nothing look
 * sooner (see `liveView`).
 */
export const SUBSCRIBE_POLL_MS = 100;

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

/** How long one wait for the server's word of a commit lasts before it is made again. */
const ANNOUNCE_WAIT_MS = 1000;

/**
 * The live view of a local or database world (none for a virtual one, which only this process
 * appends to, and whose appends wake their subscribers themselves). It asks the world what was
 * committed since its last look (`changes`: the streams with rows after a mark) and wakes only the
 * subscribers of those streams: whenever the world's log files change, as another process's
 * commit changes them (so such events are seen at once), or a database announces a commit, and
 * every `SUBSCRIBE_POLL_MS` besides, should the file system or the database not report changes.
 * One look per world, however many subscribers it has: each subscriber reading its stream at each
 * poll and at each change anywhere in the world cost a core for 1,000 idle subscriptions. A commit
 * reports several changes, and a process appending fast reports thousands a second: see
 * `WATCH_DELAY_MS`. (The watcher's timers are `node:timers`' own, which fake timers installed on
 * the global object leave running; the poll's is the global one.)
 */
export function liveView(world: World, handle: NativeWorld): Live | undefined {
  const dataDir = world.dataDir;
  // A world opened by an earlier copy of this package (see `shared` in worlds.ts) has a handle
  // without `changes`: its subscribers poll their streams themselves, as that copy's do.
  if (typeof (handle as { changes?: unknown }).changes !== 'function') return undefined;
  // A world of a database hears of other hosts' commits from the server (see `listen` below);
  // a virtual world has no other writers.
  const announces = dataDir === undefined && (handle as { announces?: boolean }).announces === true;
  if (dataDir === undefined && !announces) return undefined;
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
        // A database's mark (a transaction id) goes back only when its server restarted having lost
        // transactions it had begun, and gives their ids again: the commits of those ids, at or
        // below the old mark, are in no look's streams.
        const back = mark !== undefined && c.mark < mark;
        mark = c.mark;
        if (first && !marked) {
          // Subscribers read only once the mark is taken: what commits after it, the next look finds.
          marked = true;
          markTaken();
        } else if (first || back || c.streams === null) {
          // A first look that failed left no mark, or the mark went back: anything may have changed.
          wakeSubscribers(world);
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
  // While a subscriber waits: the server's word of each commit, naming its streams, wakes their
  // subscribers at once; word that anything may have changed (after a lost connection) makes a
  // look. The look's poll stays the fallback, so a lost notification only delays. Runs only while
  // someone waits, since a pending call keeps the process alive.
  let listening = false;
  const listen = async () => {
    if (listening) return;
    listening = true;
    try {
      while (!stopped && live.waiting > 0) {
        const streams = JSON.parse(await handle.nextAnnouncement(ANNOUNCE_WAIT_MS)) as string[] | null;
        if (stopped || streams === null) continue;
        if (streams.length === 0) look();
        else wakeSubscribers(world, new Set(streams));
      }
    } catch {
      // Closed, or failing: the poll goes on, and each subscriber's read reports what is wrong.
    } finally {
      listening = false;
    }
  };
  const live: Live = {
    subscribers: 0,
    waiting: 0,
    ready: new Promise<void>((resolve) => (markTaken = resolve)),
    // A subscriber waits now: the poll keeps the process alive (the next is scheduled so if due).
    keepAlive: () => {
      poll?.ref?.();
      if (announces) void listen();
    },
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
    if (dataDir === undefined) throw new Error('no files to watch');
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
