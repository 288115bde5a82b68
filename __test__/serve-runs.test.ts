// `GET /api/runs` of `little serve`, a page at a time: the cursor walk, the status and time
// filters, and 400 for a parameter that cannot be a queryRuns option.
import { describe, expect, it } from 'vitest';
import * as lib from '@little-workflow/world';
import { appendEvent, listRuns, type RunSummary, type World } from '@little-workflow/world';
import { serveWorld, worldKinds } from './helpers';

type Page = { runs: RunSummary[]; cursor: string | null };

async function serve(world: World, using: typeof lib = lib) {
  const s = await serveWorld(world, {}, using);
  return {
    async get(query: string): Promise<{ status: number; body: Page & { error?: string } }> {
      const res = await fetch(`${s.base}/api/runs${query}`);
      return { status: res.status, body: await res.json() };
    },
    close: s.close,
  };
}

/** 25 runs: every fifth completed, every seventh failed, the rest running. */
async function seed(world: World): Promise<void> {
  for (let i = 0; i < 25; i++) {
    const id = `run_${String(i).padStart(2, '0')}`;
    await appendEvent(world, id, { type: 'RunStarted', payload: {} });
    if (i % 5 === 0) await appendEvent(world, id, { type: 'RunCompleted', payload: {} });
    else if (i % 7 === 0) await appendEvent(world, id, { type: 'RunFailed', payload: { error: { message: 'no' } } });
  }
}

/** Newest first: by last event time, then id, both descending. */
const newestFirst = (a: RunSummary, b: RunSummary) =>
  a.lastRecordedAt !== b.lastRecordedAt ? (a.lastRecordedAt < b.lastRecordedAt ? 1 : -1) : a.runId < b.runId ? 1 : -1;

/** Every page of a query, following each cursor; the number of pages too. */
async function walk(get: (q: string) => Promise<{ status: number; body: Page }>, query: string) {
  const runs: RunSummary[] = [];
  let cursor: string | null = null;
  let pages = 0;
  do {
    const r = await get(`?${query}${cursor === null ? '' : `&cursor=${encodeURIComponent(cursor)}`}`);
    expect(r.status).toBe(200);
    runs.push(...r.body.runs);
    cursor = r.body.cursor;
    pages += 1;
  } while (cursor !== null && pages < 100);
  return { runs, pages, cursor };
}

describe.each(worldKinds)('GET /api/runs on %s', (_name, makeWorld) => {
  it('pages every run once, newest first, by the cursor each page gives', async () => {
    const world = makeWorld();
    await seed(world);
    const s = await serve(world);
    try {
      const all = [...(await listRuns(world))].sort(newestFirst);
      const first = await s.get('');
      expect(first.status).toBe(200);
      expect(Object.keys(first.body).sort()).toEqual(['cursor', 'runs']);
      expect(first.body.runs).toEqual(all);
      expect(first.body.cursor).toBeNull();

      const { runs, pages } = await walk(s.get, 'limit=4');
      expect(pages).toBe(7);
      expect(runs).toEqual(all);
      expect(new Set(runs.map((r) => r.runId)).size).toBe(25);
      // An empty parameter is an absent one: the first page.
      expect((await s.get('?cursor=&limit=4&status=')).body.runs).toEqual(all.slice(0, 4));
      // Another order, given with its own cursor.
      expect((await walk(s.get, 'limit=10&order=id')).runs.map((r) => r.runId)).toEqual(all.map((r) => r.runId).sort());
    } finally {
      await s.close();
    }
  });

  it('filters by status (any of, comma-separated) and by last event time', async () => {
    const world = makeWorld();
    await seed(world);
    const s = await serve(world);
    try {
      const all = [...(await listRuns(world))].sort(newestFirst);
      const completed = (await walk(s.get, 'status=completed&limit=2')).runs;
      expect(completed.map((r) => r.runId)).toEqual(['run_20', 'run_15', 'run_10', 'run_05', 'run_00']);
      expect(completed).toEqual(all.filter((r) => r.status === 'completed'));
      const ended = (await walk(s.get, 'status=completed,failed&limit=3')).runs;
      expect(ended).toEqual(all.filter((r) => r.status === 'completed' || r.status === 'failed'));
      expect(ended.map((r) => r.runId).sort()).toEqual(['run_00', 'run_05', 'run_07', 'run_10', 'run_14', 'run_15', 'run_20', 'run_21']);
      expect((await s.get('?status=paused')).body).toEqual({ runs: [], cursor: null });

      const cut = all[10]!.lastRecordedAt;
      const before = (await walk(s.get, `before=${encodeURIComponent(cut)}&limit=5`)).runs;
      const after = (await walk(s.get, `after=${encodeURIComponent(cut)}&limit=5`)).runs;
      expect(before).toEqual(all.filter((r) => r.lastRecordedAt < cut));
      expect(after).toEqual(all.filter((r) => r.lastRecordedAt >= cut));
    } finally {
      await s.close();
    }
  });

  it('answers 400 with the reason for a parameter that is not a page of runs', async () => {
    const world = makeWorld();
    await seed(world);
    const s = await serve(world);
    try {
      const idCursor = (await s.get('?order=id&limit=1')).body.cursor!;
      const bad: Array<[string, RegExp]> = [
        ['?limit=0', /^limit: /],
        ['?limit=10001', /^limit: /],
        ['?limit=abc', /^limit: /],
        ['?limit=1.5', /^limit: /],
        ['?order=sideways', /^order: /],
        ['?cursor=nonsense', /^cursor: /],
        [`?cursor=${idCursor}`, /^cursor: /], // a cursor of the id order, for the newest order
        ['?before=yesterday', /^before: /],
        ['?after=2026-13-45T00:00:00Z', /^after: /],
        ['?status=,', /^status: /],
        ['?colour=red', /unknown parameter "colour"/],
        ['?limit=1&limit=2', /limit is given 2 times/],
      ];
      for (const [query, message] of bad) {
        const r = await s.get(query);
        expect(r.status, query).toBe(400);
        expect(r.body.error, query).toMatch(message);
      }
      expect((await s.get('?limit=10000')).status).toBe(200);
    } finally {
      await s.close();
    }
  });

  // Each page read takes a thread that event streams read with too: however many clients ask
  // for however many different pages, two are read at a time, and the rest wait their turn.
  it('reads at most two pages at once, whatever is asked', async () => {
    const world = makeWorld();
    await seed(world);
    let reading = 0;
    let most = 0;
    const counted = {
      ...lib,
      queryRuns: async (w: Parameters<typeof lib.queryRuns>[0], opts: Parameters<typeof lib.queryRuns>[1]) => {
        most = Math.max(most, ++reading);
        try {
          await new Promise((r) => setTimeout(r, 20));
          return await lib.queryRuns(w, opts);
        } finally {
          reading -= 1;
        }
      },
    };
    const s = await serve(world, counted);
    try {
      const answers = await Promise.all(Array.from({ length: 8 }, (_, i) => s.get(`?limit=${i + 1}`)));
      expect(answers.map((a) => [a.status, a.body.runs.length])).toEqual(Array.from({ length: 8 }, (_, i) => [200, i + 1]));
      expect(most).toBe(2);
    } finally {
      await s.close();
    }
  });
});
