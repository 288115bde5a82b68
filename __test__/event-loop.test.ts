// How a busy world shares the event loop: settling yields between bursts, and does so through
// libuv rather than JavaScript timers, so fake timers cannot hold appends back.
import { afterEach, describe, expect, it, vi } from 'vitest';
import { appendEvent, localWorld, type World } from '@little-workflow/world';
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
});
