import type { Server } from 'node:http';

/** The `little serve` HTTP server for an open world; `openStreams` holds one controller per live SSE stream. */
export function createServer(
  lib: typeof import('../world'),
  world: import('../world').World,
  /**
   * `loopbackOnly`: refuse requests whose Host header names another machine (by default, when
   * the server listens on a loopback address).
   */
  options?: { inspectorDir?: string; heartbeatMs?: number; loopbackOnly?: boolean },
): Server & { openStreams: Set<AbortController> };
/** Run `little serve` with command-line arguments; resolves with the exit code. */
export function main(argv: string[]): Promise<number>;
/** A command-line usage error (exit code 2). */
export class UsageError extends Error {}
