// Helpers shared by the benchmarks.
import { execFileSync } from 'node:child_process';
import { cpus } from 'node:os';

/** This machine's sha256 throughput in MB/s per `openssl speed -evp sha256` (16 KiB blocks), or null. */
export function opensslSha256MBps() {
  try {
    const out = execFileSync('openssl', ['speed', '-seconds', '2', '-bytes', String(16 * 1024), '-evp', 'sha256'], {
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
