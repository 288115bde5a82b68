// The S3-compatible test server: the one `scripts/with-s3.mjs` (and so `npm test`) starts, or the
// one LITTLE_TEST_S3_ENDPOINT names; requests to it signed as an S3 client signs them (SigV4, with
// the AWS_* credentials of the environment: moto refuses anonymous reads of objects); a bucket per
// test; control of the server and a proxy in front of it, for fault tests.
import { spawn } from 'node:child_process';
import { createHash, createHmac, randomBytes } from 'node:crypto';
import { closeSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer, connect, type AddressInfo, type Server, type Socket } from 'node:net';
import { afterEach } from 'vitest';
import { needs } from './helpers';

const buckets: string[] = [];
let s3Checked: boolean | undefined;

afterEach(async () => {
  // moto forgets everything when it stops, but a server of the user's own keeps what a test left.
  for (const bucket of buckets.splice(0)) {
    try {
      for (const key of await listKeys(bucket)) await s3Request('DELETE', bucket, key);
      await s3Request('DELETE', bucket);
    } catch {
      // the server is down, or the bucket is gone with a restart
    }
  }
});

/** The endpoint of the test server: `LITTLE_TEST_S3_ENDPOINT`. */
export function s3Endpoint(): string | undefined {
  return process.env.LITTLE_TEST_S3_ENDPOINT || undefined;
}

/**
 * Whether the S3 tests can run, by `needs()`: without a server this says so once per test file in
 * a `SKIPPED:` line and returns false, and under `CI=true` it throws.
 */
export function needsS3(): boolean {
  s3Checked ??= needs(
    'an S3-compatible server (LITTLE_TEST_S3_ENDPOINT)',
    s3Endpoint() !== undefined,
    'run the tests through `npm test` or `node scripts/with-s3.mjs <command>` with moto\'s server installed (pip install "moto[server]==5.2.6"), or set LITTLE_TEST_S3_ENDPOINT (and the AWS_* credentials) to a server the tests may use',
  );
  return s3Checked;
}

const region = () => process.env.AWS_REGION || process.env.AWS_DEFAULT_REGION || 'us-east-1';
const sha256 = (data: string | Buffer) => createHash('sha256').update(data).digest('hex');
const hmac = (key: string | Buffer, data: string) => createHmac('sha256', key).update(data).digest();
/** RFC 3986 percent-encoding, as SigV4 wants it (encodeURIComponent leaves !'()* alone). */
const enc = (s: string) => encodeURIComponent(s).replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);

/**
 * A request to the test server, path-style (`<endpoint>/<bucket>/<key>`), signed with SigV4.
 * Resolves with any status; rejects only when the server cannot be reached.
 */
export async function s3Request(
  method: string,
  bucket: string,
  key = '',
  opts: { body?: Buffer; query?: Record<string, string>; headers?: Record<string, string> } = {},
): Promise<{ status: number; body: Buffer }> {
  const endpoint = new URL(s3Endpoint()!);
  const path = `/${bucket}${key === '' ? '' : `/${key.split('/').map(enc).join('/')}`}`;
  const query = Object.entries(opts.query ?? {})
    .map(([k, v]) => `${enc(k)}=${enc(v)}`)
    .sort()
    .join('&');
  const amzDate = new Date().toISOString().replace(/[-:]|\.\d{3}/g, '');
  const day = amzDate.slice(0, 8);
  const payloadHash = sha256(opts.body ?? '');
  const headers: Record<string, string> = {
    host: endpoint.host,
    'x-amz-content-sha256': payloadHash,
    'x-amz-date': amzDate,
    ...(opts.body ? { 'content-type': 'application/octet-stream' } : {}),
    ...(process.env.AWS_SESSION_TOKEN ? { 'x-amz-security-token': process.env.AWS_SESSION_TOKEN } : {}),
    ...Object.fromEntries(Object.entries(opts.headers ?? {}).map(([k, v]) => [k.toLowerCase(), v])),
  };
  const names = Object.keys(headers).sort();
  const canonical = [method, path, query, ...names.map((n) => `${n}:${headers[n].trim()}`), '', names.join(';'), payloadHash].join('\n');
  const scope = `${day}/${region()}/s3/aws4_request`;
  const toSign = ['AWS4-HMAC-SHA256', amzDate, scope, sha256(canonical)].join('\n');
  const signingKey = ['s3', 'aws4_request'].reduce(hmac, hmac(hmac(`AWS4${process.env.AWS_SECRET_ACCESS_KEY ?? ''}`, day), region()));
  const signature = createHmac('sha256', signingKey).update(toSign).digest('hex');
  const authorization = `AWS4-HMAC-SHA256 Credential=${process.env.AWS_ACCESS_KEY_ID ?? ''}/${scope}, SignedHeaders=${names.join(';')}, Signature=${signature}`;
  const { host: _, ...sent } = headers; // fetch sets Host itself, to the same value
  const res = await fetch(`${endpoint.origin}${path}${query ? `?${query}` : ''}`, { method, headers: { ...sent, authorization }, body: opts.body && new Uint8Array(opts.body) });
  return { status: res.status, body: Buffer.from(await res.arrayBuffer()) };
}

async function ok(what: string, p: Promise<{ status: number; body: Buffer }>): Promise<Buffer> {
  const res = await p;
  if (res.status < 200 || res.status > 299) throw new Error(`${what}: HTTP ${res.status} ${res.body.toString('utf8').slice(0, 500)}`);
  return res.body;
}

/** A new, empty bucket of the test's own (`t-<random hex>`), removed after the test. */
export async function createBucket(): Promise<string> {
  const bucket = `t-${randomBytes(8).toString('hex')}`;
  await ok(`create bucket ${bucket}`, s3Request('PUT', bucket));
  buckets.push(bucket);
  return bucket;
}

/** A bucket name no bucket has. */
export const missingBucket = (): string => `t-missing-${randomBytes(8).toString('hex')}`;

/** Write an object behind the world's back (unconditionally). */
export async function putObject(bucket: string, key: string, body: Buffer): Promise<void> {
  await ok(`PUT ${bucket}/${key}`, s3Request('PUT', bucket, key, { body }));
}

/** An object's bytes, or undefined when there is none. */
export async function getObject(bucket: string, key: string): Promise<Buffer | undefined> {
  const res = await s3Request('GET', bucket, key);
  if (res.status === 404) return undefined;
  if (res.status !== 200) throw new Error(`GET ${bucket}/${key}: HTTP ${res.status} ${res.body.toString('utf8').slice(0, 500)}`);
  return res.body;
}

/** Delete an object behind the world's back. */
export async function deleteObject(bucket: string, key: string): Promise<void> {
  await ok(`DELETE ${bucket}/${key}`, s3Request('DELETE', bucket, key));
}

const unescapeXml = (s: string) => s.replace(/&(lt|gt|quot|apos|amp);/g, (_, e: string) => ({ lt: '<', gt: '>', quot: '"', apos: "'", amp: '&' })[e]!);

/** Every key in the bucket that starts with `prefix`, sorted (ListObjectsV2, page by page). */
export async function listKeys(bucket: string, prefix = ''): Promise<string[]> {
  const keys: string[] = [];
  let token: string | undefined;
  do {
    const query: Record<string, string> = { 'list-type': '2', prefix, ...(token ? { 'continuation-token': token } : {}) };
    const xml = (await ok(`list ${bucket}`, s3Request('GET', bucket, '', { query }))).toString('utf8');
    for (const m of xml.matchAll(/<Key>([^<]*)<\/Key>/g)) keys.push(unescapeXml(m[1]));
    token = /<IsTruncated>true<\/IsTruncated>/.test(xml) ? unescapeXml(/<NextContinuationToken>([^<]*)</.exec(xml)![1]) : undefined;
  } while (token);
  return keys.sort();
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A loopback port on which nothing listens (it was free a moment ago). */
export async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address() as AddressInfo;
  await new Promise((r) => server.close(r));
  return port;
}

/** Whether something accepts connections on a loopback port. */
function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect(port, '127.0.0.1');
    s.once('connect', () => (s.destroy(), resolve(true)));
    s.once('error', () => resolve(false));
  });
}

/** A loopback TCP server, closed (its connections cut) by `close()`. */
export interface TestServer {
  endpoint: string;
  close(): Promise<void>;
}

async function listen(onConnection: (socket: Socket) => void): Promise<TestServer & { server: Server }> {
  const sockets = new Set<Socket>();
  const server = createServer((socket) => {
    sockets.add(socket);
    socket.once('close', () => sockets.delete(socket));
    socket.on('error', () => socket.destroy());
    onConnection(socket);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    server,
    endpoint: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise((r) => server.close(r));
    },
  };
}

/** A server that accepts connections and never answers: every request to it times out. */
export const silentServer = (): Promise<TestServer> => listen(() => {});

/**
 * A TCP proxy to the test server, counting the bytes that cross it: `onBytes(up, down)` is called
 * after each chunk, with the totals of every connection so far toward the server (`up`) and back
 * (`down`). When the server cannot be reached, the proxy cuts its client's connection.
 */
export async function s3Proxy(onBytes: (up: number, down: number) => void, delayMs = 0): Promise<TestServer> {
  const target = new URL(s3Endpoint()!);
  let up = 0;
  let down = 0;
  // Each piece is held `delayMs` before it goes on, in order: a slow link, not a broken one.
  const later = (f: () => void) => (delayMs > 0 ? setTimeout(f, delayMs) : f());
  return listen((client) => {
    const server = connect(Number(target.port), target.hostname);
    const cut = () => (client.destroy(), server.destroy());
    server.on('error', cut);
    client.on('close', () => later(cut));
    server.on('close', () => later(cut));
    client.on('data', (d: Buffer) => {
      up += d.length;
      later(() => server.write(d));
      onBytes(up, down);
    });
    server.on('data', (d: Buffer) => {
      down += d.length;
      later(() => client.write(d));
      onBytes(up, down);
    });
  });
}

/** Control of the test server, for fault tests. A restarted moto has lost every bucket. */
export interface S3Control {
  /** Kill the server (SIGKILL) and wait until its port refuses connections. */
  stop(): Promise<void>;
  /** Start it again on the same port and wait until it answers. */
  start(): Promise<void>;
}

/**
 * Control of the test server, from `LITTLE_TEST_S3_CTL` as `scripts/with-s3.mjs` sets it; undefined
 * when the server is not one it started.
 */
export function s3Control(raw = process.env.LITTLE_TEST_S3_CTL): S3Control | undefined {
  if (!raw) return undefined;
  const ctl = JSON.parse(raw) as { pidFile: string; command: string[]; port: number; log: string };
  const waitFor = async (up: boolean, what: string) => {
    for (const deadline = Date.now() + 30_000; (await listening(ctl.port)) !== up; await sleep(50)) {
      if (Date.now() > deadline) throw new Error(`the S3 test server ${what} after 30 s: see ${ctl.log}`);
    }
  };
  return {
    async stop() {
      const pid = Number(readFileSync(ctl.pidFile, 'utf8'));
      for (const target of [-pid, pid]) {
        try {
          process.kill(target, 'SIGKILL');
        } catch {
          // not running
        }
      }
      await waitFor(false, 'still accepts connections');
    },
    async start() {
      // A second server would fail to bind, and its pid in the file would hide the first.
      if (await listening(ctl.port)) throw new Error(`something already listens on port ${ctl.port}: stop the server first`);
      const out = openSync(ctl.log, 'a');
      // Detached, as scripts/with-s3.mjs starts it, which kills the pid in the file at its end.
      const child = spawn(ctl.command[0], ctl.command.slice(1), { detached: true, stdio: ['ignore', out, out] });
      closeSync(out);
      child.unref();
      writeFileSync(ctl.pidFile, String(child.pid));
      await waitFor(true, 'does not accept connections');
      // Listening comes a moment before answering.
      for (const deadline = Date.now() + 30_000; ; await sleep(50)) {
        try {
          await fetch(`${s3Endpoint()}/`, { signal: AbortSignal.timeout(2_000) }).then((r) => r.arrayBuffer());
          return;
        } catch (e) {
          if (Date.now() > deadline) throw new Error(`the S3 test server does not answer after 30 s: see ${ctl.log}`, { cause: e });
        }
      }
    },
  };
}
