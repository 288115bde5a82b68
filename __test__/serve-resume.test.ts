// Resuming an event stream of `little serve`: each `id:` names its event (`<sequence>:<eventId>`),
// a resume point whose event the run no longer holds there (a run deleted and started again) gets
// `event: reset` and the end of the stream instead of another history, a bare sequence (as older
// clients send) resumes as before, and the inspector page shows such a run again from the start.
import { existsSync } from 'node:fs';
import { EventSource } from 'eventsource';
import { chromium } from 'playwright-core';
import { describe, expect, it } from 'vitest';
import { appendEvent, deleteRun, listEvents, localWorld, type EventEnvelope, type World } from '@little-workflow/world';
import { needs, serveWorld, tempDir, track } from './helpers';

const step = (name: string) => ({ type: 'StepStarted', payload: { stepPath: name } });

const serve = (world: World) => serveWorld(world);

/** A world with run `runId` of these steps, and its stored events. */
async function seeded(runId: string, names: string[]): Promise<{ world: World; events: EventEnvelope[] }> {
  const world = track(localWorld({ dataDir: tempDir() }));
  for (const n of names) await appendEvent(world, runId, step(n));
  return { world, events: [...(await listEvents(world, runId))] };
}

type Frame = { id: string | undefined; event: string; data: string };

/**
 * The event frames of a stream (comments and `retry:` left out) until `count` have come, or the
 * server ends it (`ended`); throws after 10 s without either.
 */
async function frames(url: string, headers: Record<string, string>, count: number): Promise<{ status: number; frames: Frame[]; ended: boolean }> {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), 10_000);
  const res = await fetch(url, { headers, signal: controller.signal });
  const out: Frame[] = [];
  let ended = false;
  try {
    if (res.status !== 200) return { status: res.status, frames: out, ended: true };
    const reader = res.body!.getReader();
    const decoder = new TextDecoder();
    let text = '';
    while (out.length < count) {
      const chunk = await reader.read();
      if (chunk.done) {
        ended = true;
        break;
      }
      text += decoder.decode(chunk.value, { stream: true });
      let end;
      while (out.length < count && (end = text.indexOf('\n\n')) >= 0) {
        const lines = text.slice(0, end).split('\n');
        text = text.slice(end + 2);
        const field = (name: string) => lines.find((l) => l.startsWith(`${name}: `))?.slice(name.length + 2);
        const data = field('data');
        if (data !== undefined) out.push({ id: field('id'), event: field('event') ?? 'message', data });
      }
    }
  } catch (err) {
    if (controller.signal.aborted) throw new Error(`the stream gave ${out.length} of ${count} frames in 10 s`);
    throw err;
  } finally {
    clearTimeout(timer);
    controller.abort();
  }
  return { status: res.status, frames: out, ended };
}

const idOf = (e: EventEnvelope) => `${e.sequence}:${e.eventId}`;
const sequences = (fs: Frame[]) => fs.map((f) => (JSON.parse(f.data) as EventEnvelope).sequence);

async function until(cond: () => boolean, timeoutMs = 10_000): Promise<void> {
  const start = Date.now();
  while (!cond()) {
    if (Date.now() - start > timeoutMs) throw new Error('timed out waiting');
    await new Promise((r) => setTimeout(r, 10));
  }
}

describe('resuming an event stream of little serve', () => {
  it('names each event by its sequence and event id, and resumes after such an id', async () => {
    const { world, events } = await seeded('run_ids', ['a1', 'a2', 'a3']);
    const s = await serve(world);
    const url = `${s.base}/api/runs/run_ids/events`;
    try {
      const all = await frames(url, {}, 3);
      expect(all.frames.map((f) => f.id)).toEqual(events.map(idOf));
      expect(all.frames.map((f) => f.event)).toEqual(['StepStarted', 'StepStarted', 'StepStarted']);
      expect(sequences((await frames(url, { 'last-event-id': idOf(events[0]) }, 2)).frames)).toEqual([2, 3]);
      expect(sequences((await frames(`${url}?after=${idOf(events[1])}`, {}, 1)).frames)).toEqual([3]);
      // An EventSource keeps the id as it came, and sends it back when it reconnects.
      const es = new EventSource(url);
      const ids: string[] = [];
      es.addEventListener('StepStarted', (ev) => ids.push(ev.lastEventId));
      try {
        await until(() => ids.length === 3);
      } finally {
        es.close();
      }
      expect(ids).toEqual(events.map(idOf));
      // Not a resume point: an event id without a sequence after 0, an empty or malformed one.
      for (const bad of [`0:${events[0].eventId}`, '2:', ':evt_0000000000000000', '2:evt 1', '2:evt_1:evt_2', '2;evt_1']) {
        expect((await fetch(url, { headers: { 'last-event-id': bad } })).status, bad).toBe(400);
      }
    } finally {
      await s.close();
    }
  });

  it('ends with event: reset, not the new history, when the run was deleted and started again', async () => {
    const { world, events: old } = await seeded('run_again', ['a1', 'a2', 'a3']);
    const s = await serve(world);
    const url = `${s.base}/api/runs/run_again/events`;
    try {
      await deleteRun(world, 'run_again');
      for (const n of ['b1', 'b2', 'b3', 'b4']) await appendEvent(world, 'run_again', step(n));
      const expectReset = (r: { status: number; frames: Frame[]; ended: boolean }, sequence: number) => {
        expect(r.status).toBe(200);
        expect(r.ended).toBe(true);
        expect(r.frames).toHaveLength(1);
        expect(r.frames[0].event).toBe('reset');
        expect(r.frames[0].id).toBeUndefined();
        const data = JSON.parse(r.frames[0].data);
        expect(data).toEqual({ error: expect.stringContaining('from the start'), code: 'EVENT_LOG_CORRUPT', runId: 'run_again', sequence });
      };
      // Sequence 3 holds another event now; the one resumed from is gone.
      expectReset(await frames(url, { 'last-event-id': idOf(old[2]) }, 2), 3);
      expectReset(await frames(`${url}?after=${idOf(old[1])}`, {}, 2), 2);
      // Past the end of the new run, or of no run at all.
      await deleteRun(world, 'run_again');
      await appendEvent(world, 'run_again', step('c1'));
      expectReset(await frames(url, { 'last-event-id': idOf(old[2]) }, 2), 3);
      await deleteRun(world, 'run_again');
      expectReset(await frames(url, { 'last-event-id': idOf(old[0]) }, 2), 1);
      await until(() => s.server.openStreams.size === 0);
    } finally {
      await s.close();
    }
  });

  it('sends an EventSource that reconnects across a deletion the reset, which it can act on', async () => {
    const { world, events: old } = await seeded('run_live', ['a1', 'a2', 'a3']);
    const s = await serve(world);
    const es = new EventSource(`${s.base}/api/runs/run_live/events`);
    const seen: number[] = [];
    const resets: Array<Record<string, unknown>> = [];
    es.addEventListener('StepStarted', (ev) => seen.push(JSON.parse(ev.data).sequence));
    es.addEventListener('reset', (ev) => {
      resets.push(JSON.parse(ev.data));
      es.close();
    });
    try {
      await until(() => seen.length === 3);
      // The server drops the stream; the run is deleted and started again before the client is
      // back (after the stream's retry: 1000), with more events than the client had.
      for (const c of s.server.openStreams) c.abort();
      await deleteRun(world, 'run_live');
      for (const n of ['b1', 'b2', 'b3', 'b4', 'b5']) await appendEvent(world, 'run_live', step(n));
      await until(() => resets.length === 1);
      expect(resets[0]).toMatchObject({ code: 'EVENT_LOG_CORRUPT', runId: 'run_live', sequence: old[2].sequence });
      expect(seen).toEqual([1, 2, 3]);
      await until(() => s.server.openStreams.size === 0);
    } finally {
      es.close();
      await s.close();
    }
  });

  it('resumes after a bare sequence, as older clients send it, without checking which event is there', async () => {
    const { world, events } = await seeded('run_old', ['a1', 'a2', 'a3']);
    const s = await serve(world);
    const url = `${s.base}/api/runs/run_old/events`;
    try {
      const resumed = await frames(url, { 'last-event-id': '1' }, 2);
      expect(sequences(resumed.frames)).toEqual([2, 3]);
      expect(resumed.frames.map((f) => f.id)).toEqual(events.slice(1).map(idOf));
      expect(sequences((await frames(`${url}?after=2`, {}, 1)).frames)).toEqual([3]);
      await deleteRun(world, 'run_old');
      for (const n of ['b1', 'b2', 'b3']) await appendEvent(world, 'run_old', step(n));
      const after = await frames(url, { 'last-event-id': '2' }, 1);
      expect(after.frames[0].event).toBe('StepStarted');
      expect(JSON.parse(after.frames[0].data).payload).toEqual({ stepPath: 'b3' });
    } finally {
      await s.close();
    }
  });
});

const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';
const HAS_CHROMIUM = needs(`Chromium (at ${CHROMIUM})`, existsSync(CHROMIUM), "install Debian's chromium (apt-get install chromium) or set CHROMIUM_PATH");

describe.runIf(HAS_CHROMIUM)('the inspector page, on a run deleted and started again', () => {
  it('drops what it shows of the run and shows the run again from the start', async () => {
    const { world } = await seeded('run_shown', ['a1', 'a2', 'a3', 'a4', 'a5']);
    const s = await serve(world);
    const browser = await chromium.launch({
      executablePath: CHROMIUM,
      args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    });
    try {
      const asked: string[] = [];
      s.server.on('request', (req) => asked.push(req.url ?? ''));
      const page = await browser.newPage();
      const rows = () => page.$$eval('#timeline [data-seq]', (ns) => ns.map((n) => `${(n as HTMLElement).dataset.seq} ${n.querySelector('.ev-sum')?.textContent?.match(/[abc]\d/)?.[0]}`));
      await page.goto(`${s.base}/#run_shown`);
      await page.waitForFunction(() => document.querySelectorAll('#timeline [data-seq]').length === 5, undefined, { timeout: 10_000 });
      await page.waitForFunction(() => document.querySelector('#live-indicator')?.textContent === 'live', undefined, { timeout: 10_000 });
      // The stream drops; the run is started again, with more events than the page holds, before
      // the page is back: its read from its last event (#5, now another) gets the reset.
      for (const c of s.server.openStreams) c.abort();
      await deleteRun(world, 'run_shown');
      const again = ['b1', 'b2', 'b3', 'b4', 'b5', 'b6', 'b7'];
      for (const n of again) await appendEvent(world, 'run_shown', step(n));
      await page.waitForFunction(() => Array.from(document.querySelectorAll('#timeline [data-seq]')).some((n) => n.textContent?.includes('b7')), undefined, { timeout: 10_000 });
      await page.waitForFunction(() => document.querySelectorAll('#timeline [data-seq]').length === 7, undefined, { timeout: 10_000 });
      expect(await rows()).toEqual(again.map((n, i) => `${i + 1} ${n}`));
      const debug = () => page.evaluate(() => (window as unknown as { __inspector: { debug(): { reloads: number; lastContig: number } } }).__inspector.debug());
      expect(await debug()).toMatchObject({ reloads: 1, lastContig: 7 });
      // It had resumed from its last event by id, and then read the run from the start.
      const reads = asked.filter((u) => u.startsWith('/api/runs/run_shown/events'));
      const resumed = reads.findIndex((u) => /\?after=5:evt_[0-9a-f]{16}$/.test(u));
      expect(resumed).toBeGreaterThan(0);
      expect(reads.slice(resumed + 1)).toContain('/api/runs/run_shown/events?after=0');
      // Started again with fewer events, while the stream stays open: /state counts fewer than the
      // page holds (it is read again when the run list, polled every 3 s, says so).
      await deleteRun(world, 'run_shown');
      await appendEvent(world, 'run_shown', step('c1'));
      await page.waitForFunction(() => document.querySelectorAll('#timeline [data-seq]').length === 1, undefined, { timeout: 10_000 });
      expect(await rows()).toEqual(['1 c1']);
      expect(await debug()).toMatchObject({ reloads: 2, lastContig: 1 });
    } finally {
      await browser.close();
      await s.close();
    }
  }, 60_000);
});
