// The live view and the command line against clients that misbehave: odd request targets, HEAD,
// slow readers, readers that leave early, a full disk, and a world closed under a subscriber.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import type { ServerResponse } from 'node:http';
import net, { type AddressInfo } from 'node:net';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, describe, expect, it } from 'vitest';
import * as lib from '@little-workflow/world';
import { appendEvent, localWorld, subscribe, virtualWorld, WorldClosedError, type EventEnvelope } from '@little-workflow/world';
import { createServer } from '../server/serve.js';
import { packageRoot, tempDir, track } from './helpers';

const LITTLE = join(packageRoot, 'bin', 'little.js');
const children: ChildProcess[] = [];
afterEach(() => {
  for (const c of children.splice(0)) if (c.exitCode === null) c.kill('SIGKILL');
});

async function seeded(n: number, payload: Record<string, unknown> = {}): Promise<string> {
  const dataDir = tempDir();
  const w = localWorld({ dataDir, durability: 'normal' });
  await Promise.all(Array.from({ length: n }, (_, i) => appendEvent(w, 'run_r', { type: 'Note', payload: { i, ...payload } })));
  await w.close();
  return dataDir;
}

/** Send raw bytes; resolve with whatever came back within `ms`, or once it holds `until`. */
function raw(port: number, text: string, ms = 1000, until?: string): Promise<string> {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1', () => s.write(text));
    let buf = '';
    const t = setTimeout(() => {
      s.destroy();
      resolve(buf);
    }, ms);
    s.on('data', (d) => {
      buf += d;
      if (until !== undefined && buf.includes(until)) {
        clearTimeout(t);
        s.destroy();
        resolve(buf);
      }
    });
    s.on('error', () => {});
    s.on('close', () => {
      clearTimeout(t);
      resolve(buf);
    });
  });
}

async function listening(dataDir: string) {
  const server = createServer(lib, track(localWorld({ dataDir, durability: 'normal' })));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return { server, port: (server.address() as AddressInfo).port };
}

describe('little serve', () => {
  it('reads a page of runs once for the requests that ask for it meanwhile, each begun after the requests it answers came', async () => {
    const world = track(localWorld({ dataDir: await seeded(3), durability: 'normal' }));
    // Ordered by events, not by timers (a loaded machine took more than 50 ms to send a request):
    // the first reading holds its answer until the test lets it go, after the later requests came.
    let calls = 0;
    let listed!: () => void;
    const firstListed = new Promise<void>((r) => (listed = r));
    let release!: () => void;
    const released = new Promise<void>((r) => (release = r));
    const slow = {
      ...lib,
      queryRuns: async (w: Parameters<typeof lib.queryRuns>[0], opts: Parameters<typeof lib.queryRuns>[1]) => {
        const call = ++calls;
        const page = await lib.queryRuns(w, opts);
        if (call === 1) {
          listed();
          await released;
        }
        return page;
      },
    };
    const server = createServer(slow, world);
    // The handler asks for its page before its first await, so once a request's event has been
    // emitted, that request is waiting on a reading.
    let requests = 0;
    let allCame!: () => void;
    const sixCame = new Promise<void>((r) => (allCame = r));
    server.on('request', () => {
      if (++requests === 6) allCame();
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
    const port = (server.address() as AddressInfo).port;
    type Page = { runs: { eventCount: number }[]; cursor: string | null };
    const get = () => fetch(`http://127.0.0.1:${port}/api/runs`).then((r) => r.json() as Promise<Page>);
    try {
      const first = get();
      await firstListed; // the first reading has read the runs
      // Appended after it began, before these requests: they share one reading, begun after it.
      await appendEvent(world, 'run_r', { type: 'Note', payload: {} });
      const later = Promise.all(Array.from({ length: 5 }, get));
      await sixCame;
      release();
      expect((await first).runs[0].eventCount).toBe(3);
      const answers = await later;
      for (const b of answers) expect(b).toEqual(answers[0]);
      expect(answers[0].runs[0].eventCount).toBe(4);
      expect(calls).toBe(2);
    } finally {
      release();
      await new Promise((r) => server.close(r));
    }
  });

  it('answers odd request targets with 404 or 400, and keeps serving', async () => {
    const child = spawn(process.execPath, [LITTLE, 'serve', '--data-dir', await seeded(3), '--port', '0'], { stdio: ['ignore', 'pipe', 'pipe'] });
    children.push(child);
    let stderr = '';
    child.stderr!.on('data', (d) => (stderr += d));
    const port = await new Promise<number>((resolve, reject) => {
      let out = '';
      child.stdout!.on('data', (d) => {
        out += d;
        const m = /:(\d+)\//.exec(out);
        if (m) resolve(Number(m[1]));
      });
      child.once('exit', () => reject(new Error(`serve exited: ${stderr}`)));
    });
    // `new URL('//', base)` throws: this used to end the whole server. They are paths (of nothing
    // served), and a target that is not a path at all is a bad request.
    for (const target of ['//', '/\\']) {
      expect(await raw(port, `GET ${target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`)).toMatch(/^HTTP\/1\.1 404/);
    }
    expect(await raw(port, `GET http://127.0.0.1/api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`)).toMatch(/^HTTP\/1\.1 200/);
    expect(await raw(port, `GET http://evil.example/api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`)).toMatch(/^HTTP\/1\.1 403/);
    expect(await raw(port, `GET ftp://127.0.0.1/api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`)).toMatch(/^HTTP\/1\.1 400/);
    const res = await fetch(`http://127.0.0.1:${port}/api/runs`);
    expect(res.status).toBe(200);
    expect(child.exitCode).toBe(null);
    expect(stderr).toBe('');
  });

  it('answers a malformed escape in a run id with 400, and HEAD of a stream with its headers alone', async () => {
    const { server, port } = await listening(await seeded(3));
    try {
      expect((await fetch(`http://127.0.0.1:${port}/api/runs/%E0%A4%A/state`)).status).toBe(400);
      // Node writes no body for HEAD, and never flushed the headers of a stream it could not write.
      const reply = await raw(port, 'HEAD /api/runs/run_r/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n', 1000);
      expect(reply.split('\r\n')[0]).toBe('HTTP/1.1 200 OK');
      expect(reply).toContain('content-type: text/event-stream');
      expect(server.openStreams.size).toBe(0);
      // An empty Last-Event-ID is no resume point: ?after= still counts.
      // Until the event after 2 came (an id 2 would have come before it), however long that takes.
      const sse = await raw(port, 'GET /api/runs/run_r/events?after=2 HTTP/1.1\r\nHost: 127.0.0.1\r\nLast-Event-ID: \r\n\r\n', 30_000, 'id: 3:');
      expect(sse).toMatch(/^HTTP\/1\.1 200/);
      expect(sse).toContain('id: 3:');
      expect(sse).not.toContain('id: 2:');
    } finally {
      server.closeAllConnections();
      server.close();
    }
  });

  it('keeps a constant number of listeners on the stream of a slow reader', async () => {
    const { server, port } = await listening(await seeded(150, { big: 'x'.repeat(50_000) }));
    let response: ServerResponse | undefined;
    server.on('request', (_req, res) => (response = res));
    const s = net.connect(port, '127.0.0.1', () => s.write('GET /api/runs/run_r/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n'));
    let got = 0;
    let most = 0;
    // Until half a megabyte has come (ten events, each a wait for 'drain' or more), however long
    // that takes: a loaded machine sent less than that in a fixed 2.5 s.
    let enough!: () => void;
    const gotEnough = new Promise<void>((r) => (enough = r));
    s.on('close', () => enough()); // a stream that ends early fails below, not by the timeout
    s.on('data', (d) => {
      got += d.length;
      most = Math.max(most, response?.listenerCount('close') ?? 0);
      if (got > 500_000) enough();
      s.pause();
      setTimeout(() => s.resume(), 5);
    });
    await gotEnough;
    s.destroy();
    server.closeAllConnections();
    server.close();
    expect(got).toBeGreaterThan(500_000);
    // It used to add one 'close' listener per wait for 'drain', and never remove it.
    expect(most).toBeLessThan(5);
  }, 20_000);
});

describe('little', () => {
  it('exits 1 from verify on a damaged world even when its reader leaves early', async () => {
    const dataDir = await seeded(2000);
    const db = new Database(join(dataDir, 'events', 'events.db'));
    db.prepare("DELETE FROM events WHERE run_id = 'run_r' AND sequence % 2 = 0").run();
    db.close();
    const piped = spawnSync('bash', ['-c', `set -o pipefail; "${process.execPath}" "${LITTLE}" verify --data-dir "${dataDir}" | head -1 >/dev/null; echo "\${PIPESTATUS[0]}"`], { encoding: 'utf8' });
    expect(piped.stdout.trim()).toBe('1');
    expect(piped.stderr).toMatch(/little verify: hole/);
  }, 30_000);

  it('says in one line that it could not write its output', async () => {
    const dataDir = await seeded(3);
    const r = spawnSync('bash', ['-c', `"${process.execPath}" "${LITTLE}" events run_r --data-dir "${dataDir}" > /dev/full`], { encoding: 'utf8' });
    expect(r.status).toBe(1);
    expect(r.stderr).toMatch(/^little: cannot write the output: .*ENOSPC/);
    expect(r.stderr).not.toMatch(/\n\s+at /);
  });
});

describe('subscribe and close', () => {
  it('rejects on a world closed before, and yields nothing more once a close has resolved', async () => {
    const closed = virtualWorld();
    await closed.close();
    await expect(subscribe(closed, 'run_r')[Symbol.asyncIterator]().next()).rejects.toBeInstanceOf(WorldClosedError);

    const world = virtualWorld();
    await Promise.all(Array.from({ length: 300 }, (_, i) => appendEvent(world, 'run_r', { type: 'Note', payload: { i } })));
    const seen: EventEnvelope[] = [];
    let afterClose = 0;
    let isClosed = false;
    for await (const e of subscribe(world, 'run_r')) {
      seen.push(e);
      if (isClosed) afterClose++;
      if (seen.length === 10) {
        await world.close();
        isClosed = true;
      }
    }
    // The rest of the page already read used to come through.
    expect(afterClose).toBe(0);
    expect(seen.map((e) => e.sequence)).toEqual(Array.from({ length: 10 }, (_, i) => i + 1));
  });
});
