// The inspector page in headless Chromium (Debian's chromium, driven by playwright-core): it shows
// a run, shows an appended event without a reload, and a screenshot of a priced run is saved to
// __test__/artifacts/ as a test artifact. Without Chromium these tests are skipped, and fail under
// CI=true (see `needs`).
import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium, type Browser } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import * as lib from '@little-workflow/world';
import { appendEvent, localWorld, virtualWorld, type World } from '@little-workflow/world';
import { createServer } from '../server/serve.js';
import { needs } from './helpers';

const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';
const ARTIFACTS = join(__dirname, 'artifacts');
const HAS_CHROMIUM = needs(`Chromium (at ${CHROMIUM})`, existsSync(CHROMIUM), "install Debian's chromium (apt-get install chromium) or set CHROMIUM_PATH");

let browser: Browser;
let world: World;
let server: ReturnType<typeof createServer>;
let base: string;
// The suite's one world, in a directory of its own: a test's temporary directories are removed
// after each test.
let dataDir: string;

async function pricedRun(runId: string) {
  const responded = (i: number, step: string, provider: string, modelId: string, input: number, output: number) => ({
    type: 'harness.model.responded',
    appendIdempotencyKey: `${runId}:${i}`,
    payload: { turn: i, callId: `c${i}`, stepPath: step, model: { provider, modelId }, response: { usage: { inputTokens: input, outputTokens: output, cachedInputTokens: Math.floor(input / 4) } } },
  });
  const facts = [
    { type: 'RunStarted', payload: { workflowVersionId: 'wv_demo', input: { topic: 'inspector' } } },
    { type: 'StepStarted', payload: { stepPath: 'plan', stepKind: 'ai.generate' } },
    responded(1, 'plan', 'openai', 'gpt-5', 12_000, 2_400),
    { type: 'StepCompleted', payload: { stepPath: 'plan', output: { steps: 2 } } },
    { type: 'ParallelGroupStarted', payload: { stepPath: 'fan', groupId: 'g1', branchCount: 2 } },
    { type: 'ParallelBranchScheduled', payload: { stepPath: 'fan/a', groupId: 'g1', branch: 'a' } },
    { type: 'ParallelBranchScheduled', payload: { stepPath: 'fan/b', groupId: 'g1', branch: 'b' } },
    responded(2, 'fan/a', 'anthropic', 'claude-sonnet-4-5', 30_000, 4_000),
    responded(3, 'fan/b', 'google', 'gemini-2.5-pro', 8_000, 1_000),
    responded(4, 'fan/a', 'acme', 'in-house-model', 5_000, 500),
    { type: 'ParallelBranchCompleted', payload: { stepPath: 'fan/a', groupId: 'g1', branch: 'a', output: 'A' } },
    { type: 'ParallelBranchCompleted', payload: { stepPath: 'fan/b', groupId: 'g1', branch: 'b', output: 'B' } },
    { type: 'ParallelGroupCompleted', payload: { stepPath: 'fan', groupId: 'g1' } },
  ];
  for (const f of facts) await appendEvent(world, runId, f);
  return facts.length;
}

describe.runIf(HAS_CHROMIUM)('the inspector page', () => {
  beforeAll(async () => {
    dataDir = mkdtempSync(join(tmpdir(), 'little-inspector-test-'));
    browser = await chromium.launch({
      executablePath: CHROMIUM,
      args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    });
    world = localWorld({ dataDir });
    server = createServer(lib, world);
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });

  afterAll(async () => {
    await browser?.close();
    for (const c of server?.openStreams ?? []) c.abort();
    server?.closeAllConnections();
    // Without a server (its setup failed) there is nothing to wait for, and nothing would call r.
    if (server) await new Promise((r) => server.close(r));
    await world?.close();
    if (dataDir !== undefined) rmSync(dataDir, { recursive: true, force: true });
  });

  it('shows a run, adds an appended event without a reload, and draws cost bars', async () => {
    const n = await pricedRun('run_inspected');
    const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
    try {
      await page.goto(`${base}/#run_inspected`);
      await page.waitForSelector('#runs [data-run-id="run_inspected"]');
      await page.waitForFunction((count) => document.querySelectorAll('#timeline [data-seq]').length === count, n);
      expect(await page.textContent('#run-title')).toContain('run_inspected');
      // The state (steps, bars) is drawn from /state, fetched apart from the events: if that first
      // fetch fails, the events still arrive by the stream and the state is drawn from a later
      // fetch. So these wait for it (up to 10 s) instead of reading at once (`locator.count()`
      // does not wait).
      await page.waitForSelector('#steps [data-step-path="plan"][data-status="completed"]', { timeout: 10_000 });
      await page.waitForFunction(() => document.querySelectorAll('#bars-models .bar').length === 4, undefined, { timeout: 10_000 });
      expect(await page.locator('#bars-models .bar').count()).toBe(4);
      await page.waitForFunction(() => document.querySelectorAll('#bars-steps .bar').length >= 3, undefined, { timeout: 10_000 });
      await page.waitForFunction(() => document.querySelector('#live-indicator')?.textContent?.includes('live'));

      // Live: an event appended now appears without a reload.
      await appendEvent(world, 'run_inspected', { type: 'StepStarted', payload: { stepPath: 'summarize', stepKind: 'ai.generate' } });
      await page.waitForSelector(`#timeline [data-seq="${n + 1}"]`, { timeout: 10_000 });
      await page.waitForSelector('#steps [data-step-path="summarize"]', { timeout: 10_000 });
      await appendEvent(world, 'run_inspected', { type: 'RunCompleted', payload: { output: { ok: true } } });
      await page.waitForFunction(() => document.querySelector('#run-status')?.textContent?.includes('completed'), undefined, { timeout: 10_000 });
      // The status comes from /state, the row from the stream (drawn 40 ms after it arrives):
      // either can be drawn first, so wait for the row too.
      await page.waitForSelector(`#timeline [data-seq="${n + 2}"]`, { timeout: 10_000 });
      expect(await page.locator('#timeline [data-seq]').count()).toBe(n + 2);

      mkdirSync(ARTIFACTS, { recursive: true });
      const shot = join(ARTIFACTS, 'inspector-priced-run.png');
      await page.screenshot({ path: shot, fullPage: true });
      expect(existsSync(shot)).toBe(true);
    } finally {
      await page.close();
    }
  });

  // The timeline keeps the last 2,000 rows: a run of 200,000 events took 20 s and 150 MB to show,
  // reading every event from the first.
  it('reads only the events the timeline keeps of a long run', async () => {
    const n = 2300;
    for (let i = 1; i <= n; i++) await appendEvent(world, 'run_long', { type: 'StepStarted', payload: { stepPath: `s${i}` } });
    const asked: string[] = [];
    const log = (req: { url?: string }) => asked.push(req.url ?? '');
    server.on('request', log);
    const page = await browser.newPage();
    try {
      await page.goto(`${base}/#run_long`);
      await page.waitForSelector(`#timeline [data-seq="${n}"]`, { timeout: 10_000 });
      await page.waitForSelector('#timeline [data-seq="301"]', { timeout: 10_000 });
      expect(await page.locator('#timeline [data-seq]').count()).toBe(2000);
      const reads = asked.filter((u) => u.startsWith('/api/runs/run_long/events'));
      expect(reads.length).toBeGreaterThan(0);
      expect(reads.filter((u) => !u.includes('?after=') || Number(u.split('?after=')[1]) < n - 2000)).toEqual([]);
    } finally {
      server.off('request', log);
      await page.close();
    }
  }, 60_000);

  // The stream names each event by its type, and EventSource hands an event named `error` to its
  // error handler too: the page took each such fact for a dropped connection and reconnected,
  // with a backoff that doubled each time.
  it('shows an event of type error as an event, without reconnecting', async () => {
    // One in the backlog, so that the page knows the type before the live ones come.
    await appendEvent(world, 'run_errors', { type: 'RunStarted', payload: {} });
    await appendEvent(world, 'run_errors', { type: 'error', payload: { message: 'failure 2' } });
    const page = await browser.newPage();
    try {
      await page.goto(`${base}/#run_errors`);
      await page.waitForSelector('#timeline [data-seq="2"]');
      await page.waitForFunction(() => document.querySelector('#live-indicator')?.textContent?.includes('live'));
      await page.evaluate(() => {
        const seen: string[] = [];
        (window as unknown as { liveSeen: string[] }).liveSeen = seen;
        const n = document.querySelector('#live-indicator') as Element;
        new MutationObserver(() => seen.push(n.textContent ?? '')).observe(n, { childList: true, characterData: true, subtree: true });
      });
      for (let seq = 3; seq <= 5; seq++) {
        await appendEvent(world, 'run_errors', { type: 'error', payload: { message: `failure ${seq}` } });
        await page.waitForSelector(`#timeline [data-seq="${seq}"]`, { timeout: 10_000 });
      }
      expect(await page.evaluate(() => (window as unknown as { liveSeen: string[] }).liveSeen.filter((t) => !t.includes('live')))).toEqual([]);
    } finally {
      await page.close();
    }
  });

  // The page knows the event types the package knows, asked of the server once: it kept a list of
  // its own, which had fallen behind the package's.
  it('draws the types the server knows as known, any other as custom, and all as custom when it cannot ask', async () => {
    await appendEvent(world, 'run_types', { type: 'StepStarted', payload: { stepPath: 'a' } });
    await appendEvent(world, 'run_types', { type: 'my.custom.fact', payload: { note: 'mine' } });
    const categories = async (failTypes: boolean) => {
      const page = await browser.newPage();
      const errors: string[] = [];
      page.on('pageerror', (e) => errors.push(e.message));
      try {
        if (failTypes) await page.route('**/api/types', (route) => route.abort());
        await page.goto(`${base}/#run_types`);
        await page.waitForSelector('#timeline [data-seq="2"]');
        await page.waitForFunction(() => document.querySelector('#live-indicator')?.textContent?.includes('live'));
        expect(errors).toEqual([]);
        return await page.$$eval('#timeline [data-seq]', (rows) => rows.map((r) => `${(r as HTMLElement).dataset.type} ${(r as HTMLElement).dataset.cat}`));
      } finally {
        await page.close();
      }
    };
    expect(await categories(false)).toEqual(['StepStarted step', 'my.custom.fact custom']);
    expect(await categories(true)).toEqual(['StepStarted custom', 'my.custom.fact custom']);
  });

  // Served with a token (as beyond loopback): the URL little serve prints sets the cookie, the
  // page's address loses the token, and every fetch and the event stream carry the cookie.
  it('works on a server that needs a token, opened from the URL with ?token=', async () => {
    const token = 'inspector-test-token-0123456789abcdef';
    const guarded = createServer(lib, world, { token });
    await new Promise<void>((r) => guarded.listen(0, '127.0.0.1', r));
    const at = `http://127.0.0.1:${(guarded.address() as AddressInfo).port}`;
    const unauthorized: string[] = [];
    guarded.on('request', (req, res) => res.on('finish', () => res.statusCode === 401 && unauthorized.push(req.url ?? '')));
    const context = await browser.newContext();
    const page = await context.newPage();
    try {
      // Without it: no page, and nothing of the runs.
      const refused = await page.goto(`${at}/#run_inspected`);
      expect(refused?.status()).toBe(401);
      expect(await page.textContent('body')).toContain('needs its token');
      const n = await pricedRun('run_tokened');
      unauthorized.length = 0;
      await page.goto(`${at}/?token=${token}#run_tokened`);
      expect(page.url()).toBe(`${at}/#run_tokened`);
      await page.waitForSelector('#runs [data-run-id="run_tokened"]');
      await page.waitForFunction((count) => document.querySelectorAll('#timeline [data-seq]').length === count, n);
      await page.waitForSelector('#steps [data-step-path="plan"][data-status="completed"]', { timeout: 10_000 });
      await page.waitForFunction(() => document.querySelector('#live-indicator')?.textContent?.includes('live'));
      await appendEvent(world, 'run_tokened', { type: 'StepStarted', payload: { stepPath: 'after-token' } });
      await page.waitForSelector(`#timeline [data-seq="${n + 1}"]`, { timeout: 10_000 });
      // The page's script cannot read the cookie, and no request was refused.
      expect(await page.evaluate(() => document.cookie)).toBe('');
      const cookies = await context.cookies(at);
      expect(cookies.map((c) => [c.value, c.httpOnly, c.sameSite])).toEqual([[token, true, 'Strict']]);
      expect(unauthorized).toEqual([]);
    } finally {
      await context.close();
      for (const c of guarded.openStreams) c.abort();
      guarded.closeAllConnections();
      await new Promise((r) => guarded.close(r));
    }
  });

  // The state of a run with no events is 404: the page says the run has none yet, and shows the
  // first when it comes.
  it('shows a run with no events yet as pending, then its first event live', async () => {
    const page = await browser.newPage();
    try {
      await page.goto(`${base}/#run_later`);
      await page.waitForSelector('#timeline .timeline-empty');
      expect(await page.textContent('#timeline .timeline-empty')).toContain('No events yet');
      await page.waitForFunction(() => document.querySelector('#live-indicator')?.textContent?.includes('live'));
      expect(await page.isHidden('#run-error')).toBe(true);
      await appendEvent(world, 'run_later', { type: 'RunStarted', payload: {} });
      await page.waitForSelector('#timeline [data-seq="1"]', { timeout: 10_000 });
      await page.waitForFunction(() => document.querySelector('#run-status')?.textContent?.includes('running'), undefined, { timeout: 10_000 });
    } finally {
      await page.close();
    }
  });

  // The list reads 100 runs at a time, newest first: a status narrows it on the server, "Load
  // more" reads the next page, and the poll reads the first page alone, keeping the rest.
  it('lists the newest runs first, narrows them by status, and loads more a page at a time', async () => {
    const many = virtualWorld();
    const ids = Array.from({ length: 130 }, (_, i) => `run_list_${String(i).padStart(3, '0')}`);
    for (const [i, id] of ids.entries()) {
      await appendEvent(many, id, { type: 'RunStarted', payload: {} });
      if (i % 10 === 0) await appendEvent(many, id, { type: 'RunFailed', payload: { error: { message: 'no' } } });
    }
    const listing = createServer(lib, many);
    await new Promise<void>((r) => listing.listen(0, '127.0.0.1', r));
    const at = `http://127.0.0.1:${(listing.address() as AddressInfo).port}`;
    const asked: string[] = [];
    listing.on('request', (req) => asked.push(req.url ?? ''));
    const page = await browser.newPage();
    const rows = () => page.$$eval('#runs [data-run-id]', (lis) => lis.map((li) => (li as HTMLElement).dataset.runId!));
    try {
      await page.goto(`${at}/`);
      await page.waitForFunction(() => document.querySelectorAll('#runs [data-run-id]').length === 100);
      expect(await rows()).toEqual([...ids].reverse().slice(0, 100));
      expect(await page.textContent('#runs-status')).toBe('100+ runs');
      await page.click('#runs-more');
      await page.waitForFunction(() => document.querySelectorAll('#runs [data-run-id]').length === 130);
      expect(await rows()).toEqual([...ids].reverse());
      expect(await page.isHidden('#runs-more')).toBe(true);

      // A poll brings a new run and one of the second page's to the top, and keeps the rest.
      const polls = asked.length;
      await appendEvent(many, 'run_list_new', { type: 'RunStarted', payload: {} });
      await new Promise((r) => setTimeout(r, 5)); // a later time, so that run_list_005 is the newest
      await appendEvent(many, 'run_list_005', { type: 'StepStarted', payload: { stepPath: 'a' } });
      await page.waitForFunction(() => document.querySelector('#runs [data-run-id]')?.getAttribute('data-run-id') === 'run_list_005', undefined, { timeout: 10_000 });
      const after = await rows();
      expect(after.slice(0, 2)).toEqual(['run_list_005', 'run_list_new']);
      expect([...after].sort()).toEqual([...ids, 'run_list_new'].sort());
      const runsAsked = asked.filter((u) => u.startsWith('/api/runs?'));
      expect(runsAsked.filter((u) => u.includes('cursor='))).toHaveLength(1);
      expect(asked.slice(polls).every((u) => !u.includes('cursor='))).toBe(true);

      await page.selectOption('#runs-state', 'failed');
      await page.waitForFunction(() => document.querySelectorAll('#runs [data-run-id]').length === 13);
      expect(await rows()).toEqual(ids.filter((_, i) => i % 10 === 0).reverse());
      expect(await page.$$eval('#runs .status', (badges) => badges.map((b) => b.textContent))).toEqual(Array(13).fill('failed'));
      expect(await page.isHidden('#runs-more')).toBe(true);
      expect(asked.at(-1)).toMatch(/[?&]status=failed(&|$)/);
      await page.selectOption('#runs-state', 'paused');
      await page.waitForSelector('#runs-empty:not([hidden])');
      expect(await page.textContent('#runs-empty')).toBe('No paused runs.');
    } finally {
      await page.close();
      listing.closeAllConnections();
      await new Promise((r) => listing.close(r));
      await many.close();
    }
  }, 30_000);

  // The server judges a run id; the page says what it answered.
  it('shows the server\'s refusal of a malformed run id', async () => {
    const page = await browser.newPage();
    try {
      await page.goto(`${base}/#not_a_run`);
      await page.waitForFunction(() => document.querySelector('#run-error')?.textContent?.includes('400'), undefined, { timeout: 10_000 });
      expect(await page.textContent('#run-error')).toContain('invalid run id');
      expect(await page.textContent('#run-title')).toBe('not_a_run');
    } finally {
      await page.close();
    }
  });
});
