// How a busy world shares the event loop: settling yields between bursts, and does so through
// libuv rather than JavaScript timers, so fake timers cannot hold appends back.
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { appendEvent, listEvents, localWorld, type World } from '@little-workflow/world';
import { tempDir, track, worldKinds } from './helpers';

const payload = (i: number) => ({ stepPath: `step/${i % 97}`, note: 'n'.repeat(200), i });

/** `runs` chains of `per` appends each, every chain awaiting its own appends one by one. */
async function chains(world: World, runs: number, per: number, onSettled: () => void = () => {}): Promise<void> {
  await Promise.all(
    Array.from({ length: runs }, async (_, r) => {
      for (let i = 0; i < per; i++) {
        await appendEvent(world, `run_loop_${r}`, { type: 'StepStarted', payload: payload(i) });
        onSettled();
      }
    }),
  );
}

describe('sharing the event loop', () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  it('lets the loop turn between bursts of settlements', async () => {
    // A burst settles at most 256 promises (plus the group that crosses that line, here at most
    // 64) before the loop turns. Without pacing, Node settles group after group in one turn
    // while the writer keeps committing: over a thousand appends between two turns here.
    const world = track(localWorld({ dataDir: tempDir(), durability: 'normal' }));
    let settled = 0;
    let lastTurn = 0;
    let most = 0;
    let turns = 0;
    let running = true;
    const turn = () => {
      most = Math.max(most, settled - lastTurn);
      lastTurn = settled;
      turns++;
      if (running) setImmediate(turn);
    };
    setImmediate(turn);
    await chains(world, 64, 300, () => settled++);
    running = false;
    expect(settled).toBe(64 * 300);
    expect(turns).toBeGreaterThan(1);
    expect(most).toBeLessThanOrEqual(256 + 64 + 64);
  }, 300_000); // 0.5 s here, but 11-54 s on a machine loaded with 8 busy loops

  it.each(worldKinds)('%s: appends under load complete while timers are faked', async (_, makeWorld) => {
    const world = makeWorld();
    vi.useFakeTimers();
    await chains(world, 64, 100);
    vi.useRealTimers();
  });

  it('lets the loop turn while a caller awaits appends one by one', async () => {
    // A lone awaited append is settled in place (at normal, often committed in the call), and
    // its continuation starts the next in the same microtask drain: without counting those
    // settlements in bursts, a loop of awaited appends never let the event loop turn.
    const world = track(localWorld({ dataDir: tempDir(), durability: 'normal' }));
    await appendEvent(world, 'run_lone', { type: 'StepStarted', payload: payload(0) });
    let settled = 0;
    let done = false;
    const seen: number[] = [];
    const onTurn = () => {
      seen.push(settled);
      if (!done) setImmediate(onTurn);
    };
    setImmediate(onTurn);
    for (let i = 1; i <= 2000; i++) {
      await appendEvent(world, 'run_lone', { type: 'StepStarted', payload: payload(i) });
      settled++;
    }
    done = true;
    seen.push(settled);
    const most = Math.max(...seen.map((n, i) => n - (seen[i - 1] ?? 0)));
    expect(most).toBeLessThanOrEqual(257);
  });

  it('does not hold the loop while another connection holds the write lock', async () => {
    // A lone awaited append at durability normal commits on the JavaScript thread when it can do
    // so without waiting. With the lock held elsewhere it must not wait there (for up to the
    // 30 s busy timeout): the timer that lets the lock go has to run while the append waits.
    const dataDir = tempDir();
    const world = track(localWorld({ dataDir, durability: 'normal' }));
    await appendEvent(world, 'run_held', { type: 'StepStarted', payload: payload(0) });
    const other = new Database(join(dataDir, 'events', 'events.db'));
    try {
      other.exec('BEGIN IMMEDIATE');
      const turns: number[] = [];
      const released = new Promise<void>((resolve) =>
        setTimeout(() => {
          turns.push(Date.now());
          other.exec('COMMIT');
          resolve();
        }, 100),
      );
      const started = Date.now();
      const appended = appendEvent(world, 'run_held', { type: 'StepStarted', payload: payload(1) });
      // The call returned before the lock was let go.
      expect(turns).toEqual([]);
      await released;
      expect((await appended).sequence).toBe(2);
      expect(turns[0]! - started).toBeLessThan(10_000);
      expect((await listEvents(world, 'run_held')).map((e) => e.sequence)).toEqual([1, 2]);
    } finally {
      if (other.inTransaction) other.exec('ROLLBACK');
      // This other copy of SQLite in the process takes itself for the store's last connection
      // when it closes, and removes the WAL and -shm (see the README): the world is closed first.
      await world.close();
      other.close();
    }
  });
});
