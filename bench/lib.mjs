// Helpers shared by the benchmarks.
import { execFileSync } from 'node:child_process';
import { cpus } from 'node:os';

/**
 * This machine's sha256 throughput in MB/s per `openssl speed -evp sha256`, or null: by default on
 * 16 KiB blocks (which stay in the CPU's caches), or on blocks of `blockBytes`.
 */
export function opensslSha256MBps(blockBytes = 16 * 1024) {
  try {
    const out = execFileSync('openssl', ['speed', '-seconds', '1', '-bytes', String(blockBytes), '-evp', 'sha256'], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    });
    const line = out.split('\n').find((l) => /^(sha256|SHA2-256)\s/i.test(l.trim()));
    const kbps = Number(line?.trim().split(/\s+/).pop()?.replace(/k$/, ''));
    return Number.isFinite(kbps) ? (kbps * 1000) / (1024 * 1024) : null; // openssl prints 1000s of bytes/s
  } catch {
    return null;
  }
}

/** One line naming the machine. */
export function machine() {
  return `${cpus().length} x ${cpus()[0]?.model ?? 'unknown cpu'}, node ${process.version}, ${process.platform}-${process.arch}`;
}

export const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

/**
 * Event `i` of the 100,000-event runs the listing and materialization benchmarks read: a mix of
 * step starts, priced model calls (half of all events) and step outputs over 50 steps.
 */
export function eventFor(i) {
  const step = `step/${i % 50}`;
  switch (i % 4) {
    case 0:
      return { type: 'StepStarted', payload: { stepPath: step, stepKind: 'ai.generate', note: 'n'.repeat(120) } };
    case 1:
    case 2:
      return {
        type: 'harness.model.responded',
        appendIdempotencyKey: `call-${i}`,
        payload: {
          turn: 1, callId: `c${i}`, stepPath: step,
          model: i % 3 ? { provider: 'openai', modelId: 'gpt-5' } : { provider: 'anthropic', modelId: 'claude-sonnet-4-5' },
          response: { text: 'a short answer', usage: { inputTokens: 1000 + (i % 97), outputTokens: 200 + (i % 13), cachedInputTokens: 100 } },
        },
      };
    default:
      return { type: 'StepCompleted', payload: { stepPath: step, output: { ok: true, n: i } } };
  }
}

/** Gaps between 1 ms timer ticks while `work` runs, counting the gap before the first tick and after the last. */
export async function withStall(work) {
  const gaps = [];
  let last = performance.now();
  const timer = setInterval(() => {
    const now = performance.now();
    gaps.push(now - last);
    last = now;
  }, 1);
  const result = await work();
  clearInterval(timer);
  gaps.push(performance.now() - last);
  gaps.sort((a, b) => a - b);
  return { result, p99: gaps[Math.min(gaps.length - 1, Math.floor(gaps.length * 0.99))] };
}
