// A damaged database: reads refuse what they cannot return whole, and verify says what is wrong.
import { copyFileSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { describe, expect, it } from 'vitest';
import { appendEvent, EventLogCorruptError, listEvents, listRuns, localWorld, materializeRunState, verifyWorld } from '@little-workflow/world';
import { tempDir, track } from './helpers';

const RUNS = ['run_r0', 'run_r1', 'run_r2'];
const PER_RUN = 50;

/** A world of three runs of 50 events, closed, and the pages of its `(run_id, sequence)` index. */
async function seeded(): Promise<{ dataDir: string; db: string; indexPages: number[]; pageSize: number }> {
  const dataDir = tempDir();
  const world = localWorld({ dataDir });
  for (const run of RUNS) for (let i = 0; i < PER_RUN; i++) await appendEvent(world, run, { type: 'T', payload: { i } });
  await world.close();
  const db = join(dataDir, 'events', 'events.db');
  const conn = new Database(db, { readonly: true });
  const indexPages = conn
    .prepare("SELECT pageno FROM dbstat WHERE name = 'sqlite_autoindex_events_1'")
    .all()
    .map((r) => (r as { pageno: number }).pageno);
  const pageSize = conn.pragma('page_size', { simple: true }) as number;
  conn.close();
  return { dataDir, db, indexPages, pageSize };
}

/** What SQLite's own `integrity_check` says of the database file at `db`, read from a copy. */
function sqliteSays(db: string, dir: string): string {
  const copy = join(dir, 'copy.db');
  copyFileSync(db, copy);
  const conn = new Database(copy, { readonly: true });
  try {
    return (conn.pragma('integrity_check') as { integrity_check: string }[]).map((r) => r.integrity_check).join('\n');
  } catch (e) {
    return String(e);
  } finally {
    conn.close();
  }
}

/** The outcome of a read: what it returned, or the code it failed with. */
async function settle<T>(p: Promise<T>): Promise<{ value?: T; code?: string; error?: unknown }> {
  try {
    return { value: await p };
  } catch (error) {
    return { code: (error as { code?: string }).code, error };
  }
}

describe('one bit flipped in the index every read of a run goes through', () => {
  it('never returns a run with holes or out of order, and verify names the damage SQLite finds', async () => {
    const { dataDir, db, indexPages, pageSize } = await seeded();
    const original = readFileSync(db);
    const scratch = tempDir();
    let damaging = 0;
    for (const page of indexPages) {
      // Every 37th byte of the page past its header, each with one of its bits flipped.
      for (let at = 12; at < pageSize; at += 37) {
        const damaged = Buffer.from(original);
        damaged[(page - 1) * pageSize + at] ^= 1 << at % 8;
        writeFileSync(db, damaged);
        const sqlite = sqliteSays(db, scratch);
        const world = track(localWorld({ dataDir }));
        for (const run of RUNS) {
          const listed = await settle(listEvents(world, run));
          if (listed.code !== undefined) {
            expect(listed.error, `byte ${at} of page ${page}`).toBeInstanceOf(EventLogCorruptError);
            continue;
          }
          // Whatever a listing returns is dense from 1, each event the one stored at its sequence.
          listed.value!.forEach((e, i) => {
            expect(e.sequence).toBe(i + 1);
            expect(e.payload).toEqual({ i });
          });
          const state = await settle(materializeRunState(world, run));
          if (state.code !== undefined) expect(state.error).toBeInstanceOf(EventLogCorruptError);
        }
        const runs = await settle(listRuns(world));
        if (runs.code !== undefined) expect(runs.error).toBeInstanceOf(EventLogCorruptError);
        else expect(new Set(runs.value!.map((r) => r.runId)).size).toBe(runs.value!.length);
        const thorough = await verifyWorld(world, undefined, { thorough: true });
        if (sqlite !== 'ok') {
          damaging++;
          expect(thorough.ok, `byte ${at} of page ${page}: SQLite says ${sqlite}`).toBe(false);
          expect(thorough.problems.some((p) => p.kind === 'store')).toBe(true);
        }
        await world.close();
      }
    }
    writeFileSync(db, original);
    // The sweep hit the index's cells, not only its free space.
    expect(damaging).toBeGreaterThan(10);
  });

  it('is found by the fast verify too when the index no longer finds all of a run', async () => {
    const { dataDir, db, indexPages, pageSize } = await seeded();
    const conn = new Database(db);
    // An index entry of run_r1 rewritten to name another run: its row is left out of run_r1.
    const page = Buffer.from(readFileSync(db)).subarray((indexPages[0] - 1) * pageSize, indexPages[0] * pageSize);
    conn.close();
    const at = page.indexOf('run_r1');
    expect(at).toBeGreaterThan(0);
    const damaged = readFileSync(db);
    damaged[(indexPages[0] - 1) * pageSize + at + 1] ^= 0x04; // 'run_r1' becomes 'rqn_r1'
    writeFileSync(db, damaged);
    const world = track(localWorld({ dataDir }));
    const fast = await verifyWorld(world);
    expect(fast.ok).toBe(false);
    expect(fast.problems.filter((p) => p.kind === 'store').length).toBeGreaterThan(0);
    // The run's own read goes through the index and finds the hole (the list of runs reads the
    // runs catalog, which the damage did not touch).
    expect((await settle(listEvents(world, 'run_r1'))).error).toBeInstanceOf(EventLogCorruptError);
    expect((await listRuns(world)).map((r) => r.runId)).toContain('run_r1');
  });
});
