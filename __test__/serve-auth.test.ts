// Who `little serve` answers, and how much one client may hold: the Host check decided by the
// address each request arrives on, the token (header, cookie, the page's ?token= URL), what the
// process writes, 404 for the state of a run with no events, the limit on event streams, and a
// client that stops reading.
import { spawn, type ChildProcess } from 'node:child_process';
import { request, type IncomingHttpHeaders, type ServerResponse } from 'node:http';
import net, { type AddressInfo } from 'node:net';
import { networkInterfaces } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import * as lib from '@little-workflow/world';
import { appendEvent, localWorld, virtualWorld, type World } from '@little-workflow/world';
import { packageRoot, tempDir, track } from './helpers';
import { createServer } from '../server/serve.js';

const LITTLE = join(packageRoot, 'bin', 'little.js');
const SECRET = 'the-payload-nobody-else-may-read';
const TOKEN = 'a'.repeat(8) + '0123456789abcdef0123456789abcdef';

/** This machine's first address that is not a loopback one (the tests that need one skip without). */
const LAN = Object.values(networkInterfaces())
  .flat()
  .find((a) => a !== undefined && a.family === 'IPv4' && !a.internal)?.address;

const children: ChildProcess[] = [];
const servers: Array<ReturnType<typeof createServer>> = [];
afterEach(async () => {
  for (const c of children.splice(0)) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  for (const s of servers.splice(0)) {
    for (const c of s.openStreams) c.abort();
    s.closeAllConnections();
    await new Promise((r) => s.close(r));
  }
});

async function secretWorld(): Promise<World> {
  const world = track(virtualWorld());
  // A step's path is in the run's state, as the payload is in its events.
  await appendEvent(world, 'run_secret', { type: 'StepStarted', payload: { stepPath: SECRET } });
  return world;
}

async function serve(world: World, host: string, opts: Parameters<typeof createServer>[2] = {}) {
  const server = createServer(lib, world, opts);
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, host, r));
  return { server, port: (server.address() as AddressInfo).port };
}

interface Answer {
  status: number;
  headers: IncomingHttpHeaders;
  body: string;
}

/** A request to `address` with exactly these headers (fetch would send a Host of its own). */
function ask(address: string, port: number, path: string, headers: Record<string, string> = {}, method = 'GET'): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = request({ host: address, port, path, method, headers }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

async function until(cond: () => boolean, timeoutMs = 20_000): Promise<void> {
  const start = Date.now();
  while (!cond()) {
    if (Date.now() - start > timeoutMs) throw new Error('timed out waiting');
    await new Promise((r) => setTimeout(r, 10));
  }
}

describe('little serve: the Host check', () => {
  // Bound to every address, it used to skip the check: a page that pointed a name of its own at
  // 127.0.0.1 (DNS rebinding) read every run through its visitor's browser.
  it('refuses a Host that names another machine on a request that arrives on loopback, whatever the server is bound to', async () => {
    const world = await secretWorld();
    for (const bound of ['127.0.0.1', '0.0.0.0']) {
      const { port } = await serve(world, bound);
      for (const path of ['/api/runs', '/api/runs/run_secret/state', '/api/runs/run_secret/events', '/']) {
        const hostile = await ask('127.0.0.1', port, path, { host: `evil.example:${port}` });
        expect(hostile.status, `${bound} ${path}`).toBe(403);
        expect(hostile.body).not.toContain(SECRET);
      }
      const ok = await ask('127.0.0.1', port, '/api/runs/run_secret/state', { host: `localhost:${port}` });
      expect(ok.status, bound).toBe(200);
      expect(ok.body).toContain(SECRET);
    }
  });

  it.runIf(LAN !== undefined)('refuses, without a token, a request that arrives on another address', async () => {
    const { port } = await serve(await secretWorld(), '0.0.0.0');
    for (const host of [`${LAN}:${port}`, `localhost:${port}`]) {
      const r = await ask(LAN!, port, '/api/runs/run_secret/state', { host });
      expect(r.status, host).toBe(401);
      expect(r.body).not.toContain(SECRET);
    }
  });
});

describe('little serve: the token', () => {
  const arrivals = ['127.0.0.1', ...(LAN === undefined ? [] : [LAN])];

  it('answers only a request that carries the token, as a header or as the cookie, on every address', async () => {
    const { port } = await serve(await secretWorld(), '0.0.0.0', { token: TOKEN });
    const cookie = `little_token_${port}=${TOKEN}`;
    for (const address of arrivals) {
      const host = `${address === '127.0.0.1' ? 'localhost' : address}:${port}`;
      const refused: Array<Record<string, string>> = [
        {},
        { authorization: `Bearer ${TOKEN.slice(0, -1)}b` }, // as long, one character off
        { authorization: `Bearer ${TOKEN}x` },
        { authorization: `Bearer ${TOKEN.slice(0, 16)}` },
        { authorization: 'Bearer ' },
        { authorization: `Basic ${TOKEN}` },
        { cookie: `little_token_${port}=${TOKEN.slice(0, -1)}b` },
        { cookie: `little_token_${port}=x` },
        { cookie: `little_token_${port + 1}=${TOKEN}` }, // another server's cookie
      ];
      for (const headers of refused) {
        for (const path of ['/api/runs', '/api/runs/run_secret/state', '/api/runs/run_secret/events', '/', '/app.js']) {
          const r = await ask(address, port, path, { host, ...headers });
          expect(r.status, `${address} ${path} ${JSON.stringify(headers)}`).toBe(401);
          expect(r.headers['www-authenticate']).toBe('Bearer realm="little serve"');
          expect(r.body).not.toContain(SECRET);
          expect(r.body).not.toContain(TOKEN);
        }
      }
      const accepted: Array<Record<string, string>> = [
        { authorization: `Bearer ${TOKEN}` },
        { authorization: `bearer  ${TOKEN}` },
        { cookie },
        { cookie: `other=1; ${cookie}; more=2` },
      ];
      for (const headers of accepted) {
        const r = await ask(address, port, '/api/runs/run_secret/state', { host, ...headers });
        expect(r.status, `${address} ${JSON.stringify(headers)}`).toBe(200);
        expect(r.body).toContain(SECRET);
        expect((await ask(address, port, '/', { host, ...headers })).status).toBe(200);
      }
      // The token opens nothing that the Host check shuts.
      if (address === '127.0.0.1') {
        expect((await ask(address, port, '/api/runs', { host: `evil.example:${port}`, authorization: `Bearer ${TOKEN}` })).status).toBe(403);
      }
    }
  });

  it('turns the page URL\'s ?token= into an HttpOnly SameSite=Strict cookie, and loads the page again without it', async () => {
    const { port } = await serve(await secretWorld(), '127.0.0.1', { token: TOKEN });
    const host = `127.0.0.1:${port}`;
    const r = await ask('127.0.0.1', port, `/?x=1&token=${TOKEN}`, { host });
    expect(r.status).toBe(303);
    expect(r.headers.location).toBe('/?x=1');
    expect(r.headers['set-cookie']).toEqual([`little_token_${port}=${TOKEN}; Path=/; HttpOnly; SameSite=Strict`]);
    expect(r.body).toBe('');
    expect((await ask('127.0.0.1', port, `/?token=${TOKEN}`, { host })).headers.location).toBe('/');
    // The cookie it set opens the API.
    const cookie = r.headers['set-cookie']![0].split(';')[0];
    expect((await ask('127.0.0.1', port, '/api/runs/run_secret/state', { host, cookie })).status).toBe(200);
    // A wrong token sets nothing.
    for (const wrong of [`${TOKEN.slice(0, -1)}b`, 'short', '']) {
      const w = await ask('127.0.0.1', port, `/?token=${encodeURIComponent(wrong)}`, { host });
      expect(w.status, wrong).toBe(401);
      expect(w.headers['set-cookie']).toBeUndefined();
    }
    // The API takes it as a header or the cookie, not in its URL (which proxies and logs keep).
    expect((await ask('127.0.0.1', port, `/api/runs?token=${TOKEN}`, { host })).status).toBe(401);
  });

  it('needs no token on a loopback address unless one was given', async () => {
    const world = await secretWorld();
    const open = await serve(world, '127.0.0.1');
    expect((await ask('127.0.0.1', open.port, '/api/runs/run_secret/state', { host: `127.0.0.1:${open.port}` })).status).toBe(200);
    const shut = await serve(world, '127.0.0.1', { token: TOKEN });
    expect((await ask('127.0.0.1', shut.port, '/api/runs/run_secret/state', { host: `127.0.0.1:${shut.port}` })).status).toBe(401);
    expect(() => createServer(lib, world, { token: 'short' })).toThrow(/16 to 1024/);
  });
});

describe('little serve: the command', () => {
  async function seeded(): Promise<string> {
    const dataDir = tempDir();
    const w = localWorld({ dataDir, durability: 'normal' });
    await appendEvent(w, 'run_secret', { type: 'StepStarted', payload: { stepPath: SECRET } });
    await w.close();
    return dataDir;
  }

  /** `little serve` with these arguments: its first line, and all it writes once it has ended. */
  async function started(args: string[], env: Record<string, string> = {}) {
    const child = spawn(process.execPath, [LITTLE, 'serve', ...args], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } });
    children.push(child);
    let stdout = '';
    let stderr = '';
    child.stdout!.on('data', (d) => (stdout += d));
    child.stderr!.on('data', (d) => (stderr += d));
    const exited = new Promise<void>((r) => child.once('exit', () => r()));
    await Promise.race([until(() => stdout.includes('\n')), exited]);
    if (!stdout.includes('\n')) throw new Error(`little serve exited: ${stderr}`);
    const line = stdout.split('\n')[0];
    return {
      line,
      port: Number(/:(\d+)\//.exec(line)![1]),
      async end() {
        child.kill('SIGTERM');
        await exited;
        return { stdout, stderr };
      },
    };
  }

  it('on 0.0.0.0 makes a token, prints it once in the URL to open, and writes it nowhere else', async () => {
    const s = await started(['--data-dir', await seeded(), '--host', '0.0.0.0', '--port', '0']);
    const token = /\?token=([0-9a-f]+) /.exec(s.line)?.[1];
    expect(token, s.line).toMatch(/^[0-9a-f]{48}$/);
    expect(s.line).toMatch(/^little serve: http:\/\/127\.0\.0\.1:\d+\/\?token=[0-9a-f]{48} \(world .*every request needs the token/);
    const host = `127.0.0.1:${s.port}`;
    const arrivals = ['127.0.0.1', ...(LAN === undefined ? [] : [LAN])];
    for (const address of arrivals) {
      const h = { host: address === '127.0.0.1' ? host : `${address}:${s.port}` };
      expect((await ask(address, s.port, '/api/runs/run_secret/state', h)).status).toBe(401);
      expect((await ask(address, s.port, '/api/runs/run_secret/state', { ...h, authorization: `Bearer ${token!.slice(0, -1)}x` })).status).toBe(401);
      const ok = await ask(address, s.port, '/api/runs/run_secret/state', { ...h, authorization: `Bearer ${token}` });
      expect(ok.status).toBe(200);
      expect(ok.body).toContain(SECRET);
      expect((await ask(address, s.port, `/?token=${token}`, h)).status).toBe(303);
      expect((await ask(address, s.port, `/?token=${token}x`, h)).status).toBe(401);
      expect((await ask(address, s.port, `/api/nothing?token=${token}`, h)).status).toBe(401);
    }
    expect((await ask('127.0.0.1', s.port, '/api/runs', { host: `evil.example:${s.port}`, authorization: `Bearer ${token}` })).status).toBe(403);
    const { stdout, stderr } = await s.end();
    expect(stdout.split(token!).length - 1).toBe(1);
    expect(stderr).not.toContain(token);
    expect(stderr).not.toContain(token!.slice(0, 12));
  }, 30_000);

  it('takes the token from LITTLE_SERVE_TOKEN or --token, requires it on loopback too, and never prints it', async () => {
    const dataDir = await seeded();
    for (const [args, env] of [[['--token', TOKEN], {}], [[], { LITTLE_SERVE_TOKEN: TOKEN }]] as const) {
      const s = await started(['--data-dir', dataDir, '--port', '0', ...args], env);
      const host = `127.0.0.1:${s.port}`;
      expect((await ask('127.0.0.1', s.port, '/api/runs', { host })).status).toBe(401);
      expect((await ask('127.0.0.1', s.port, '/api/runs', { host, authorization: `Bearer ${TOKEN}` })).status).toBe(200);
      const { stdout, stderr } = await s.end();
      expect(stdout).not.toContain(TOKEN);
      expect(stderr).not.toContain(TOKEN);
    }
    // On loopback without one: no token, and none printed.
    const s = await started(['--data-dir', dataDir, '--port', '0']);
    expect(s.line).not.toContain('token=');
    expect((await ask('127.0.0.1', s.port, '/api/runs', { host: `127.0.0.1:${s.port}` })).status).toBe(200);
    await s.end();
  }, 30_000);

  it('says in --help what it exposes and how it is protected, and refuses a token too short', async () => {
    const { spawnSync } = await import('node:child_process');
    const help = spawnSync(process.execPath, [LITTLE, 'serve', '--help'], { encoding: 'utf8' });
    expect(help.status).toBe(0);
    for (const said of ['every run', 'read-only', 'Host', 'token', 'LITTLE_SERVE_TOKEN', 'Authorization: Bearer', '--max-streams']) {
      expect(help.stdout.replace(/\s+/g, ' ')).toContain(said);
    }
    const short = spawnSync(process.execPath, [LITTLE, 'serve', '--token', 'short', '--data-dir', tempDir()], { encoding: 'utf8' });
    expect(short.status).toBe(2);
    expect(short.stderr).toMatch(/--token must be 16 to 1024/);
  });
});

describe('little serve: runs and streams', () => {
  it('answers 404 for the state of a run with no events, as little replay exits 1', async () => {
    const { port } = await serve(await secretWorld(), '127.0.0.1');
    const host = `127.0.0.1:${port}`;
    const none = await ask('127.0.0.1', port, '/api/runs/run_nothing/state', { host });
    expect(none.status).toBe(404);
    expect(JSON.parse(none.body)).toEqual({ error: 'run_nothing has no events' });
    expect((await ask('127.0.0.1', port, '/api/runs/ses_nothing/state', { host })).status).toBe(404);
    expect((await ask('127.0.0.1', port, '/api/runs/run_secret/state', { host })).status).toBe(200);
  });

  it('opens at most maxStreams event streams, answers 503 past them, and frees a slot when its client goes', async () => {
    const world = await secretWorld();
    const { server, port } = await serve(world, '127.0.0.1', { maxStreams: 2 });
    const base = `http://127.0.0.1:${port}`;
    const clients = [new AbortController(), new AbortController()];
    for (const c of clients) {
      const res = await fetch(`${base}/api/runs/run_secret/events`, { signal: c.signal });
      expect(res.status).toBe(200);
      await res.body!.getReader().read(); // the stream is open on the server
    }
    expect(server.openStreams.size).toBe(2);
    const third = await fetch(`${base}/api/runs/run_secret/events`);
    expect(third.status).toBe(503);
    expect(third.headers.get('retry-after')).toBe('5');
    expect(((await third.json()) as { error: string }).error).toMatch(/2 event streams are open/);
    // HEAD opens no stream, and is answered as a GET would be when there is room.
    expect((await fetch(`${base}/api/runs/run_secret/events`, { method: 'HEAD' })).status).toBe(200);
    // The other requests are still answered.
    expect((await fetch(`${base}/api/runs/run_secret/state`)).status).toBe(200);
    clients[0].abort();
    await until(() => server.openStreams.size === 1);
    const fourth = new AbortController();
    const again = await fetch(`${base}/api/runs/run_secret/events`, { signal: fourth.signal });
    expect(again.status).toBe(200);
    fourth.abort();
    clients[1].abort();
    await until(() => server.openStreams.size === 0);
  });

  // 300 clients that stopped reading held 496 MB: each one's heartbeats piled up in its buffer,
  // and it kept its stream (and the subscription's page) for ever.
  it('holds a bounded buffer for a client that stops reading, and drops it once it has taken nothing for stallMs', async () => {
    const world = track(virtualWorld());
    const big = 'x'.repeat(64 * 1024);
    for (let i = 0; i < 250; i++) await appendEvent(world, 'run_big', { type: 'Note', payload: { i, big } });
    const { server, port } = await serve(world, '127.0.0.1', { heartbeatMs: 2, stallMs: 1500 });
    let response: ServerResponse | undefined;
    server.on('request', (_req, res) => (response = res));
    const client = net.connect(port, '127.0.0.1', () => client.write(`GET /api/runs/run_big/events HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n\r\n`));
    client.pause(); // it reads nothing: the kernel's buffers fill, then the server's
    client.on('error', () => {});
    try {
      await until(() => response !== undefined && response.writableNeedDrain);
      await new Promise((r) => setTimeout(r, 300)); // the kernel's buffers are full by now
      const frame = 64 * 1024 + 1024; // one event as sent
      const bound = response!.writableHighWaterMark + frame;
      const first = response!.writableLength;
      let most = first;
      const start = Date.now();
      // Heartbeats every 2 ms for most of a second: none is added to a full buffer.
      while (Date.now() - start < 800 && !response!.destroyed) {
        most = Math.max(most, response!.writableLength);
        await new Promise((r) => setTimeout(r, 20));
      }
      expect(most).toBeLessThanOrEqual(bound);
      expect(most).toBe(first);
      // Then the client is dropped, and its slot freed.
      await until(() => server.openStreams.size === 0, 10_000);
      expect(response!.destroyed).toBe(true);
    } finally {
      client.destroy();
    }
  }, 30_000);
});
