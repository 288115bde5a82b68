import type { Server } from 'node:http';

/** The `little serve` HTTP server for an open world; `openStreams` holds one controller per live SSE stream. */
export function createServer(
  lib: typeof import('../world'),
  world: import('../world').World,
  /**
   * A request that arrives on a loopback address must name this machine in its Host header (else
   * 403). `token`: every request must carry it, as `Authorization: Bearer <token>` or the cookie
   * that `/?token=<token>` sets (else 401); without it, a request that arrives on any other
   * address gets 401. `maxStreams` (default 64): event streams open at once, 503 past it.
   * `stallMs` (default 60,000): how long a client may take nothing of its full stream before it
   * is dropped.
   */
  options?: { inspectorDir?: string; heartbeatMs?: number; token?: string; maxStreams?: number; stallMs?: number },
): Server & { openStreams: Set<AbortController> };
/** Run `little serve` with command-line arguments; resolves with the exit code. */
export function main(argv: string[], env?: Record<string, string | undefined>): Promise<number>;
/** A command-line usage error (exit code 2). */
export class UsageError extends Error {}
