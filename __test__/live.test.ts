// Watching a run live: subscribe (in one process and across processes) and Server-Sent Events.
import { spawn, spawnSync } from 'node:child_process';
import { request } from 'node:http';
import type { AddressInfo } from 'node:net';
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { join } from 'node:path';
import { EventSource } from 'eventsource';
import { describe, expect, it, vi } from 'vitest';
import * as lib from '@little-workflow/world';
import { appendEvent, localWorld, subscribe, virtualWorld, type EventEnvelope, type World } from '@little-workflow/world';
import { packageRoot, serveWorld, tempDir, track } from './helpers';
import { createServer } from '../server/serve.js';

const step = (i: number) => ({ type: 'StepStarted', payload: { stepPath: `s${i}` } });

/**
 * The native handle of a world, from the registry the copies of this package share on
 * `globalThis`: its methods can be wrapped or hidden (as an earlier copy's handle lacks some).
 */
function nativeHandle(world: World): Record<string, unknown> {
  const shared = (globalThis as Record<symbol, { natives: WeakMap<World, Record<string, unknown>> }>)[Symbol.for('@little-workflow/world:worlds')];
  return shared.natives.get(world)!;
}

async function take(it: AsyncIterator<EventEnvelope>, n: number): Promise<EventEnvelope[]> {
  const out: EventEnvelope[] = [];
  while (out.length < n) {
    const r = await it.next();
    if (r.done) break;
    out.push(r.value);
  }
  return out;
}

describe('subscribe', () => {
  it('yields the backlog, then each new event as it commits, and ends on abort', async () => {
    for (const world of [track(virtualWorld()), track(localWorld({ dataDir: tempDir() }))]) {
      for (let i = 1; i <= 5; i++) await appendEvent(world, 'run_sub', step(i));
      const controller = new AbortController();
      const it = subscribe(world, 'run_sub', { afterSequence: 2, signal: controller.signal })[Symbol.asyncIterator]();
      expect((await take(it, 3)).map((e) => e.sequence)).toEqual([3, 4, 5]);
      const next = take(it, 2);
      await appendEvent(world, 'run_sub', step(6));
      await appendEvent(world, 'run_sub', step(7));
      expect((await next).map((e) => e.sequence)).toEqual([6, 7]);
      const pending = it.next();
      controller.abort();
      expect((await pending).done).toBe(true);
    }
  });

  it('refuses bad options with typed errors', async () => {
    const world = track(virtualWorld());
    for (const [opts, path] of [
      [null, 'subscribe options'],
      [{ signal: {} }, 'signal'],
      [{ afterSequence: -1 }, 'afterSequence'],
    ] as const) {
      const err = await subscribe(world, 'run_s', opts as never).next().then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err, path).toBeInstanceOf(lib.EventValidationError);
      expect((err as lib.WorldError).path, path).toBe(path);
    }
  });

  it('is woken by another writer of the data directory, not only by its poll', async () => {
    const dataDir = tempDir();
    const reader = track(localWorld({ dataDir }));
    // Another world on the same directory stands for another process: its appends do not wake
    // this world's subscribers directly. With the poll's timer held back, only watching the
    // directory can deliver them.
    const writer = track(localWorld({ dataDir }));
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
    try {
      const it = subscribe(reader, 'run_watched')[Symbol.asyncIterator]();
      const first = it.next();
      await appendEvent(writer, 'run_watched', step(1));
      expect(((await first).value as EventEnvelope).sequence).toBe(1);
      const second = it.next();
      await appendEvent(writer, 'run_watched', step(2));
      expect(((await second).value as EventEnvelope).sequence).toBe(2);
      await it.return?.();
    } finally {
      vi.useRealTimers();
    }
  }, 15_000);

  // A page is at most 256 events and about 4 MB of them: by count alone, a run of 4 MB events
  // held a gigabyte per subscriber. A page ended by its size is followed by the next at once.
  it('reads a run of large events a few at a time, page after page, without waiting between pages', async () => {
    for (const world of [track(virtualWorld()), track(localWorld({ dataDir: tempDir() }))]) {
      const big = 'x'.repeat(1 << 20);
      for (let i = 1; i <= 12; i++) await appendEvent(world, 'run_big', { type: 'StepStarted', payload: { stepPath: `s${i}`, big } });
      // With the poll's timer held back (and no commit to wake it), a subscriber that waited
      // after a page would wait for ever.
      vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
      try {
        const it = subscribe(world, 'run_big')[Symbol.asyncIterator]();
        expect((await take(it, 12)).map((e) => e.sequence)).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
        await it.return?.();
      } finally {
        vi.useRealTimers();
      }
    }
  }, 30_000);

  it('holds about 4 MB of a run of large events while its consumer waits, not a page of 256', async () => {
    const dataDir = tempDir();
    const world = localWorld({ dataDir, durability: 'normal' });
    const big = 'x'.repeat(2 << 20);
    for (let i = 1; i <= 100; i++) await appendEvent(world, 'run_big', { type: 'StepStarted', payload: { stepPath: `s${i}`, big } });
    await world.close();
    // In a process of its own, whose memory this test's appends did not grow.
    const script = `
      const { localWorld, subscribe } = require('@little-workflow/world');
      (async () => {
        const world = localWorld({ dataDir: process.argv[1], readOnly: true });
        const it = subscribe(world, 'run_big');
        const before = process.memoryUsage.rss();
        const first = await it.next();
        const grown = process.memoryUsage.rss() - before;
        await it.return();
        await world.close();
        console.log(JSON.stringify({ sequence: first.value.sequence, grownMB: grown / 2 ** 20 }));
      })();`;
    const r = spawnSync(process.execPath, ['-e', script, dataDir], { cwd: packageRoot, encoding: 'utf8' });
    expect(r.status, r.stderr).toBe(0);
    const { sequence, grownMB } = JSON.parse(r.stdout) as { sequence: number; grownMB: number };
    expect(sequence).toBe(1);
    // Two or three events of 2 MB, and their copies on the way: a page of all 100 was 200 MB.
    expect(grownMB).toBeLessThan(64);
  }, 60_000);

  it('ends at return() even while a next() waits for an event, which then resolves as done', async () => {
    const world = track(virtualWorld());
    await appendEvent(world, 'run_ret', step(1));
    const live = subscribe(world, 'run_ret');
    expect((await live.next()).value?.sequence).toBe(1);
    const waiting = live.next(); // the run never grows again
    await new Promise((r) => setTimeout(r, 30));
    const ended = await Promise.race([live.return(), new Promise((r) => setTimeout(() => r('still waiting'), 1000))]);
    expect(ended).toEqual({ done: true, value: undefined });
    expect(await waiting).toEqual({ done: true, value: undefined });
    expect(await live.next()).toEqual({ done: true, value: undefined });
    // Nothing is left to wake: the world's registry of live subscriptions (shared by every copy of
    // the module, on globalThis) holds none.
    const shared = (globalThis as Record<symbol, unknown>)[Symbol.for('@little-workflow/world:worlds')] as { wakers: WeakMap<World, Set<unknown>> };
    expect(shared.wakers.get(world)?.size ?? 0).toBe(0);
  });

  it.runIf(process.platform === 'linux')('lets go of what it holds when aborted between two events, though its consumer never pulls again', async () => {
    const dataDir = tempDir();
    const world = track(localWorld({ dataDir }));
    await appendEvent(world, 'run_ab', step(1));
    await appendEvent(world, 'run_ab', step(2));
    // Watches of this process's inotify instances (libuv keeps one for all of a loop's watchers).
    const inotify = () =>
      readdirSync('/proc/self/fd').reduce((n, fd) => {
        try {
          if (readlinkSync(`/proc/self/fd/${fd}`) !== 'anon_inode:inotify') return n;
          return n + readFileSync(`/proc/self/fdinfo/${fd}`, 'utf8').split('\n').filter((l) => l.startsWith('inotify wd:')).length;
        } catch {
          return n;
        }
      }, 0);
    const before = inotify();
    const controllers = Array.from({ length: 20 }, () => new AbortController());
    const subs = controllers.map((c) => subscribe(world, 'run_ab', { signal: c.signal }));
    for (const sub of subs) expect((await sub.next()).value?.sequence).toBe(1); // parked after the first event
    expect(inotify()).toBe(before + 1); // one watch of the events directory, shared
    for (const c of controllers) c.abort();
    // Gone once the last one let go.
    expect(inotify()).toBe(before);
    for (const sub of subs) expect(await sub.next()).toEqual({ done: true, value: undefined });
  });

  // Each subscriber read its stream at every poll (10 a second) and at every change anywhere in
  // the world: 1,000 idle subscriptions took most of a core. The world is now asked once what
  // changed, and only the subscribers of the streams with new events read.
  it('reads a quiet stream only when it has new events, however busy the rest of the world is', async () => {
    const dataDir = tempDir();
    const reader = track(localWorld({ dataDir, readOnly: false }));
    // Another world on the directory stands for another process.
    const writer = track(localWorld({ dataDir, durability: 'normal' }));
    await appendEvent(writer, 'run_quiet', step(1));
    const native = nativeHandle(reader);
    const reads: string[] = [];
    const listPacked = native.listPacked as (runId: string, ...rest: unknown[]) => Promise<unknown>;
    native.listPacked = function (this: unknown, runId: string, ...rest: unknown[]) {
      reads.push(runId);
      return listPacked.call(this, runId, ...rest);
    };
    try {
      const subs = Array.from({ length: 20 }, () => subscribe(reader, 'run_quiet')[Symbol.asyncIterator]());
      for (const sub of subs) expect(((await sub.next()).value as EventEnvelope).sequence).toBe(1);
      const waiting = subs.map((sub) => sub.next());
      const started = reads.length;
      for (let i = 0; i < 200; i++) await appendEvent(writer, 'run_busy', step(i));
      await new Promise((r) => setTimeout(r, 600)); // past the polls and the late looks
      // Not one read of the quiet stream while the other was written to.
      expect(reads.slice(started)).toEqual([]);
      await appendEvent(writer, 'run_quiet', step(2));
      for (const w of waiting) expect(((await w).value as EventEnvelope).sequence).toBe(2);
      for (const sub of subs) await sub.return?.();
    } finally {
      delete native.listPacked;
    }
  });

  // The registry of native handles is shared by the copies of this package in a process, and a
  // world opened by an earlier copy has a handle without `changes`: its first subscription threw,
  // and every later one waited for ever.
  it('delivers from a world whose native handle cannot say what changed (an earlier copy\'s)', async () => {
    const dataDir = tempDir();
    const reader = track(localWorld({ dataDir }));
    const writer = track(localWorld({ dataDir }));
    const native = nativeHandle(reader);
    native.changes = undefined;
    try {
      await appendEvent(reader, 'run_old', step(1));
      for (let round = 0; round < 2; round++) {
        const it = subscribe(reader, 'run_old')[Symbol.asyncIterator]();
        expect(((await it.next()).value as EventEnvelope).sequence).toBe(1);
        const next = it.next();
        await appendEvent(writer, 'run_old', step(2 + round)); // "another process": found by the poll
        const got = ((await next).value as EventEnvelope).sequence;
        expect(got).toBe(2);
        await it.return?.();
      }
    } finally {
      delete native.changes;
    }
  });

  // A database server that restarted having lost transactions gives their ids again, so the
  // commits of those ids are at or below a live view's mark, and in no look's streams.
  it('takes a mark that went back as anything having changed, and reads', async () => {
    const dataDir = tempDir();
    const reader = track(localWorld({ dataDir }));
    const writer = track(localWorld({ dataDir }));
    await appendEvent(writer, 'run_back', step(1));
    const native = nativeHandle(reader);
    // What changed, as such a server would say it: never a stream, and a mark that later goes back.
    let mark = 1000;
    native.changes = async () => JSON.stringify({ mark, streams: [] });
    try {
      const it = subscribe(reader, 'run_back')[Symbol.asyncIterator]();
      expect(((await it.next()).value as EventEnvelope).sequence).toBe(1);
      const next = it.next();
      await appendEvent(writer, 'run_back', step(2));
      await new Promise((r) => setTimeout(r, 300)); // looks that report nothing
      mark = 10;
      expect(((await next).value as EventEnvelope).sequence).toBe(2);
      await it.return?.();
    } finally {
      delete native.changes;
    }
  }, 10_000);

  it('ends at return() while its first read waits for the world\'s first look', async () => {
    const world = track(localWorld({ dataDir: tempDir() }));
    await appendEvent(world, 'run_slow', step(1));
    const native = nativeHandle(world);
    const changes = native.changes as (...args: unknown[]) => Promise<string>;
    let looked = false;
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    native.changes = function (this: unknown, ...args: unknown[]) {
      return held.then(() => changes.apply(this, args)).finally(() => (looked = true));
    };
    try {
      // Another subscription keeps the world's live view (and its look) going.
      const other = subscribe(world, 'run_slow')[Symbol.asyncIterator]();
      const its = other.next();
      const it = subscribe(world, 'run_slow')[Symbol.asyncIterator]();
      const first = it.next();
      await new Promise((r) => setTimeout(r, 50));
      await it.return?.();
      expect(await first).toEqual({ done: true, value: undefined });
      expect(looked).toBe(false);
      release();
      expect(((await its).value as EventEnvelope).sequence).toBe(1);
      await other.return?.();
    } finally {
      release();
      delete native.changes;
    }
  });

  it('shares one listener of a signal among the subscriptions it ends (Node warned of a leak at 11)', async () => {
    const world = track(virtualWorld());
    await appendEvent(world, 'run_signal', step(1));
    const warnings: Error[] = [];
    const warned = (w: Error) => warnings.push(w);
    process.on('warning', warned);
    try {
      const controller = new AbortController();
      const subs = Array.from({ length: 20 }, () => subscribe(world, 'run_signal', { signal: controller.signal }));
      for (const sub of subs) expect((await sub.next()).value?.sequence).toBe(1);
      // Ended one by one, and the rest by the signal.
      await subs[0].return();
      controller.abort();
      for (const sub of subs) expect(await sub.next()).toEqual({ done: true, value: undefined });
      await new Promise((r) => setImmediate(r)); // warnings are emitted on the next tick
      expect(warnings.map((w) => w.name)).toEqual([]);
    } finally {
      process.off('warning', warned);
    }
  });

  it('ends when the world closes', async () => {
    const world = localWorld({ dataDir: tempDir() });
    await appendEvent(world, 'run_close', step(1));
    const it = subscribe(world, 'run_close')[Symbol.asyncIterator]();
    expect(((await it.next()).value as EventEnvelope).sequence).toBe(1);
    const pending = it.next();
    await world.close();
    expect((await pending).done).toBe(true);
  });

  it('sees events appended by another process, never skipping or repeating a sequence', async () => {
    const dataDir = tempDir();
    const world = track(localWorld({ dataDir }));
    await appendEvent(world, 'run_cross', step(0));
    const controller = new AbortController();
    const seen: number[] = [];
    const reading = (async () => {
      for await (const e of subscribe(world, 'run_cross', { signal: controller.signal })) {
        seen.push(e.sequence);
        if (seen.length === 601) controller.abort();
      }
    })();
    const children = ['a', 'b'].map(
      (label) =>
        new Promise<number | null>((resolve) => {
          const c = spawn(process.execPath, [join(__dirname, 'fixtures', 'append-child.cjs'), dataDir, 'run_cross', '300', label], { cwd: packageRoot });
          c.on('exit', resolve);
        }),
    );
    expect(await Promise.all(children)).toEqual([0, 0]);
    await reading;
    expect(seen).toEqual(Array.from({ length: 601 }, (_, i) => i + 1));
  });
});

const serve = (world: World, opts: { heartbeatMs?: number } = {}) => serveWorld(world, opts);

/** The status of a request made with exactly these headers (fetch will not send a Host of its own). */
function statusOf(base: string, path: string, headers: Record<string, string>, method = 'GET'): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request(`${base}${path}`, { method, headers }, (res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
      res.destroy();
    });
    req.on('error', reject);
    req.end();
  });
}

describe('little serve', () => {
  // Without the check, a page elsewhere that points a name of its own at 127.0.0.1 (DNS rebinding)
  // could read every run through its visitor's browser.
  it('answers only requests for this machine by name, on its loopback address', async () => {
    const world = track(virtualWorld());
    await appendEvent(world, 'run_host', step(1));
    const s = await serve(world);
    const port = new URL(s.base).port;
    try {
      const loopback = [`127.0.0.1:${port}`, `localhost:${port}`, `[::1]:${port}`, 'app.localhost', '127.0.0.2', 'LOCALHOST', 'localhost.', '127.0.0.1.:80', '127.1', '[0:0:0:0:0:0:0:1]', '[::ffff:127.0.0.1]'];
      for (const host of loopback) {
        expect(await statusOf(s.base, '/api/runs', { host }), host).toBe(200);
      }
      for (const host of [`evil.example:${port}`, 'evil.example', `127.0.0.1.evil.example:${port}`, '[::2]', 'localhost.evil.example', '[::ffff:10.0.0.1]', 'a b']) {
        expect(await statusOf(s.base, '/api/runs', { host }), host).toBe(403);
        expect(await statusOf(s.base, '/api/runs/run_host/events', { host }), host).toBe(403);
      }
      // A sequence of 16 digits is one, when it is a safe integer.
      expect(await statusOf(s.base, '/api/runs/run_host/events', { 'last-event-id': '9007199254740991' }, 'HEAD')).toBe(200);
      expect(await statusOf(s.base, '/api/runs/run_host/events', { 'last-event-id': '9007199254740993' }, 'HEAD')).toBe(400);
      // A path that starts with two slashes is a path (it was read as a host, and answered for /runs).
      const r = await fetch(`${s.base}//api/runs`);
      expect(r.status).toBe(404);
      expect(((await r.json()) as { error: string }).error).toBe('no such path: //api/runs');
    } finally {
      await s.close();
    }
    // Served on every address (--host 0.0.0.0), a request that arrives on loopback is judged the
    // same (see serve-auth.test.ts for the token that guards the others).
    const open = createServer(lib, world);
    await new Promise<void>((r) => open.listen(0, '0.0.0.0', r));
    try {
      const base = `http://127.0.0.1:${(open.address() as AddressInfo).port}`;
      expect(await statusOf(base, '/api/runs', { host: 'my-box.lan:4710' })).toBe(403);
      expect(await statusOf(base, '/api/runs', { host: 'localhost' })).toBe(200);
    } finally {
      open.closeAllConnections();
      await new Promise((r) => open.close(r));
    }
  });

  it('answers the API, with 400 for bad ids and 404 for unknown paths', async () => {
    const world = track(virtualWorld());
    await appendEvent(world, 'run_api', step(1));
    const s = await serve(world);
    try {
      const { runs, cursor } = (await (await fetch(`${s.base}/api/runs`)).json()) as { runs: Array<{ runId: string }>; cursor: string | null };
      expect(runs.map((r: { runId: string }) => r.runId)).toEqual(['run_api']);
      expect(cursor).toBeNull();
      const state = (await (await fetch(`${s.base}/api/runs/run_api/state`)).json()) as { eventCount: number };
      expect(state.eventCount).toBe(1);
      expect((await fetch(`${s.base}/api/runs/not%20a%20run/state`)).status).toBe(400);
      expect((await fetch(`${s.base}/api/runs/run_x%2F..%2F/events`)).status).toBe(400);
      expect((await fetch(`${s.base}/api/runs/run_api/events?after=abc`)).status).toBe(400);
      expect((await fetch(`${s.base}/api/nothing`)).status).toBe(404);
      expect((await fetch(`${s.base}/api/runs`, { method: 'POST' })).status).toBe(405);
    } finally {
      await s.close();
    }
  });

  it('streams events over SSE and resumes after a disconnect with nothing lost and nothing repeated', async () => {
    const world = track(localWorld({ dataDir: tempDir() }));
    for (let i = 1; i <= 20; i++) await appendEvent(world, 'run_sse', step(i));
    const s = await serve(world, { heartbeatMs: 50 });
    const received: Array<{ id: string; type: string; seq: number; eventId: string }> = [];
    const listen = (es: EventSource) => {
      es.addEventListener('StepStarted', (ev) => {
        const env = JSON.parse(ev.data);
        received.push({ id: ev.lastEventId, type: ev.type, seq: env.sequence, eventId: env.eventId });
      });
    };
    try {
      // 1. Connect, read the backlog, and have the server drop the connection mid-run: the client
      //    reconnects by itself, sending Last-Event-ID.
      const es = new EventSource(`${s.base}/api/runs/run_sse/events`);
      listen(es);
      await until(() => received.length >= 20);
      for (const c of s.server.openStreams) c.abort(); // the server ends the stream
      for (let i = 21; i <= 40; i++) await appendEvent(world, 'run_sse', step(i));
      await until(() => received.length >= 40);
      es.close();
      // 2. The client goes away; events keep coming; a new client resumes with ?after=.
      for (let i = 41; i <= 60; i++) await appendEvent(world, 'run_sse', step(i));
      const last = received[received.length - 1].seq;
      const es2 = new EventSource(`${s.base}/api/runs/run_sse/events?after=${last}`);
      listen(es2);
      await until(() => received.length >= 60);
      es2.close();
      expect(received.map((r) => r.seq)).toEqual(Array.from({ length: 60 }, (_, i) => i + 1));
      // Each id names the event: its sequence and its event id.
      expect(received.every((r) => r.id === `${r.seq}:${r.eventId}` && r.type === 'StepStarted')).toBe(true);
      // Nothing leaks: every stream the clients opened has ended on the server.
      await until(() => s.server.openStreams.size === 0);
    } finally {
      await s.close();
    }
  });

  it('sends heartbeat comments', async () => {
    const world = track(virtualWorld());
    const s = await serve(world, { heartbeatMs: 30 });
    try {
      const controller = new AbortController();
      const res = await fetch(`${s.base}/api/runs/run_quiet/events`, { signal: controller.signal });
      const reader = res.body!.getReader();
      let text = '';
      while (!text.includes(': heartbeat')) {
        const chunk = await reader.read();
        if (chunk.done) throw new Error(`the stream ended before a heartbeat: ${text}`);
        text += new TextDecoder().decode(chunk.value);
      }
      controller.abort();
      expect(res.headers.get('content-type')).toContain('text/event-stream');
      await until(() => s.server.openStreams.size === 0);
    } finally {
      await s.close();
    }
  });
});

async function until(cond: () => boolean, timeoutMs = 20_000): Promise<void> {
  const start = Date.now();
  while (!cond()) {
    if (Date.now() - start > timeoutMs) throw new Error('timed out waiting');
    await new Promise((r) => setTimeout(r, 10));
  }
}
