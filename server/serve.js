// `little serve`: a read-only view of a world over HTTP, and the inspector page.
//
//   GET /                        the inspector: inspector/index.html, style.css, and app.js with the
//                                ES modules it imports (each listed in MODULES)
//   GET /api/types               the event types the package knows, per vocabulary (knownEventTypes())
//   GET /api/runs                the runs, newest activity first, with event count, status, last time, cost
//   GET /api/runs/:id/events     Server-Sent Events: id = sequence, event = type, data = envelope;
//                                resumes after Last-Event-ID (or ?after=N); a heartbeat comment every 15 s
//   GET /api/runs/:id/state      the materialized state
//
// Nothing here writes to the world. A client that goes away ends its subscription at once.
'use strict';

const http = require('node:http');
const { existsSync, readFileSync } = require('node:fs');
const { join } = require('node:path');
const { parseArgs } = require('node:util');
const { WORLD_HELP, WORLD_OPTIONS, UsageError, openWorld } = require('./world-args.js');

const HELP = `usage: little serve [--data-dir DIR | --database-url URL [--schema NAME]] [--port N] [--host H]

Serves the inspector at / and a read-only API (/api/types, /api/runs, /api/runs/:id/events as
Server-Sent Events, /api/runs/:id/state) for a world, on 127.0.0.1 unless --host is given, port
4710 unless --port is given (0 picks a free port).

${WORLD_HELP}`;

const HEARTBEAT_MS = 15_000;
/** The inspector's ES modules, each served as JavaScript. */
const MODULES = ['app.js', 'api.js', 'bars.js', 'dom.js', 'format.js', 'header.js', 'run.js', 'runs.js', 'steps.js', 'timeline.js'];
/** The only files served: a path not listed here is no file, whatever it names on disk. */
const STATIC = {
  '/': ['index.html', 'text/html; charset=utf-8'],
  '/index.html': ['index.html', 'text/html; charset=utf-8'],
  '/style.css': ['style.css', 'text/css; charset=utf-8'],
  ...Object.fromEntries(MODULES.map((m) => [`/${m}`, [m, 'text/javascript; charset=utf-8']])),
};

const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

function send(res, status, body, type = 'application/json; charset=utf-8') {
  res.writeHead(status, {
    'content-type': type,
    'cache-control': 'no-store',
    'x-content-type-options': 'nosniff',
    'content-security-policy': CSP,
  });
  res.end(body);
}

function sendJson(res, status, value) {
  send(res, status, JSON.stringify(value));
}

/**
 * Whether a Host header (a name or address, with or without a port) always names this machine:
 * `localhost` and its subdomains, 127.0.0.0/8 and ::1 however spelled (`127.1`, `[0:0::1]`,
 * `[::ffff:127.0.0.1]`), with or without a trailing dot.
 */
function isLoopbackHost(host) {
  let name;
  try {
    name = new URL(`http://${host}/`).hostname.toLowerCase();
  } catch {
    return false;
  }
  name = name.replace(/\.$/, '');
  return (
    name === 'localhost' ||
    name.endsWith('.localhost') ||
    /^127\.\d+\.\d+\.\d+$/.test(name) ||
    name === '[::1]' ||
    /^\[::ffff:7f[0-9a-f]{2}:[0-9a-f]{1,4}\]$/.test(name)
  );
}

/** Whether the server listens on a loopback address only (`server.address()`'s address). */
function isLoopbackAddress(address) {
  return isLoopbackHost(address.includes(':') ? `[${address}]` : address);
}

/**
 * Create the server for an open world. Resolves nothing by itself; call listen(). Listening on a
 * loopback address (or given `loopbackOnly: true`), it refuses a request whose Host header names
 * another machine: a web page elsewhere could otherwise point a name of its own at 127.0.0.1 (DNS
 * rebinding) and read every run through the visitor's browser.
 */
function createServer(lib, world, { inspectorDir = join(__dirname, '..', 'inspector'), heartbeatMs = HEARTBEAT_MS, loopbackOnly } = {}) {
  const open = new Set();
  // One listing of runs at a time: on a large world one takes seconds, and each tab or client
  // asking meanwhile started another, taking the threads that live streams read with. Requests
  // that come while one is in flight share the next, begun when it ends, so that every answer is
  // of a listing begun after the request came (it sees what was appended before).
  let current;
  let queued;
  const begin = () => {
    const listing = lib
      .listRuns(world)
      .then((runs) => [...runs].sort((a, b) => (a.lastRecordedAt < b.lastRecordedAt ? 1 : a.lastRecordedAt > b.lastRecordedAt ? -1 : 0)));
    current = listing;
    const done = () => {
      if (current === listing) current = undefined;
    };
    listing.then(done, done);
    return listing;
  };
  const listRunsFresh = () => {
    if (current === undefined) return begin();
    const ended = () => {
      queued = undefined;
      return begin();
    };
    return (queued ??= current.then(ended, ended));
  };
  const handle = async (req, res) => {
    try {
      // Unless told, judged by the address the server listens on: a loopback one however spelled.
      const guarded = loopbackOnly ?? isLoopbackAddress(server.address()?.address ?? '');
      const host = req.headers.host;
      if (guarded && host !== undefined && !isLoopbackHost(host)) {
        return sendJson(res, 403, { error: `Host ${JSON.stringify(host.slice(0, 100))} does not name this machine: this server answers localhost, 127.0.0.1 and [::1] (start it with --host to serve another address)` });
      }
      // A path is appended to an origin rather than resolved against one: '//api/runs' is a
      // path, not a host. An absolute URL (as a proxy sends) names its host itself.
      const target = req.url ?? '/';
      const absolute = !target.startsWith('/');
      let url;
      try {
        url = new URL(absolute ? target : `http://localhost${target}`);
        if (url.protocol !== 'http:') throw new Error('not http');
      } catch {
        return sendJson(res, 400, { error: 'the request target is not a path' });
      }
      if (guarded && absolute && !isLoopbackHost(url.host)) {
        return sendJson(res, 403, { error: `${url.hostname.slice(0, 100)} is not this machine` });
      }
      if (req.method !== 'GET' && req.method !== 'HEAD') {
        res.setHeader('allow', 'GET, HEAD');
        return sendJson(res, 405, { error: 'read-only: only GET and HEAD are served' });
      }
      const file = STATIC[url.pathname];
      if (file) {
        const path = join(inspectorDir, file[0]);
        if (!existsSync(path)) return sendJson(res, 404, { error: `${file[0]} is not installed` });
        return send(res, 200, readFileSync(path), file[1]);
      }
      if (url.pathname === '/api/types') return sendJson(res, 200, lib.knownEventTypes());
      if (url.pathname === '/api/runs') return sendJson(res, 200, await listRunsFresh());
      const m = /^\/api\/runs\/([^/]+)\/(events|state)$/.exec(url.pathname);
      if (!m) return sendJson(res, 404, { error: `no such path: ${url.pathname}` });
      let id;
      try {
        id = decodeURIComponent(m[1]);
      } catch {
        id = '';
      }
      if (!lib.isRunId(id) && !lib.isSessionId(id)) return sendJson(res, 400, { error: `invalid run id: expected run_ (or ses_) followed by 1-80 of [A-Za-z0-9_-]` });
      if (m[2] === 'state') return sendJson(res, 200, await lib.materializeRunState(world, id));
      return streamEvents(lib, world, id, req, res, url, open, heartbeatMs);
    } catch (err) {
      if (!res.headersSent) sendJson(res, err && err.code === 'WORLD_PATH' ? 400 : 500, { error: err.message, code: err.code });
      else res.destroy();
    }
  };
  // No request may end the server: whatever escapes the handler ends that request alone.
  const server = http.createServer((req, res) => {
    handle(req, res).catch(() => res.destroy());
  });
  server.openStreams = open;
  return server;
}

/** Until `res` can take more, or is gone; either way both listeners go. */
function drained(res) {
  return new Promise((resolve) => {
    const done = () => {
      res.off('drain', done);
      res.off('close', done);
      resolve();
    };
    res.on('drain', done);
    res.on('close', done);
  });
}

async function streamEvents(lib, world, id, req, res, url, open, heartbeatMs) {
  // An empty Last-Event-ID is no resume point (EventSource never sends one).
  const header = req.headers['last-event-id'] || undefined;
  const resumeFrom = header ?? url.searchParams.get('after') ?? '0';
  if (!/^\d{1,16}$/.test(String(resumeFrom)) || !Number.isSafeInteger(Number(resumeFrom))) return sendJson(res, 400, { error: 'Last-Event-ID / after must be a sequence number' });
  const after = Number(resumeFrom);
  res.writeHead(200, {
    'content-type': 'text/event-stream; charset=utf-8',
    'cache-control': 'no-store',
    connection: 'keep-alive',
    'x-accel-buffering': 'no',
  });
  // A HEAD request gets the headers a GET would, and no stream.
  if (req.method === 'HEAD') return res.end();
  res.write('retry: 1000\n\n');
  const controller = new AbortController();
  const heartbeat = setInterval(() => res.write(': heartbeat\n\n'), heartbeatMs);
  const stop = () => controller.abort();
  req.on('close', stop);
  res.on('close', stop);
  open.add(controller);
  try {
    for await (const e of lib.subscribe(world, id, { afterSequence: after, signal: controller.signal })) {
      const ok = res.write(`id: ${e.sequence}\nevent: ${e.type}\ndata: ${lib.canonicalize(e)}\n\n`);
      if (!ok && !controller.signal.aborted) await drained(res);
    }
  } finally {
    clearInterval(heartbeat);
    open.delete(controller);
    req.off('close', stop);
    res.end();
  }
}

async function main(argv) {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      options: { ...WORLD_OPTIONS, port: { type: 'string' }, host: { type: 'string' }, help: { type: 'boolean', short: 'h' } },
      allowPositionals: false,
    });
  } catch (err) {
    throw new UsageError(err.message);
  }
  if (parsed.values.help) {
    process.stdout.write(`${HELP}\n`);
    return 0;
  }
  const port = Number(parsed.values.port ?? 4710);
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new UsageError(`invalid port: ${parsed.values.port}`);
  const host = parsed.values.host ?? '127.0.0.1';
  const lib = require('..');
  const { world, label } = openWorld(lib, parsed.values);
  const server = createServer(lib, world);
  await new Promise((res, rej) => server.once('error', rej).listen(port, host, res));
  const addr = server.address();
  process.stdout.write(`little serve: http://${host.includes(':') ? `[${host}]` : host}:${addr.port}/ (world ${label})\n`);
  await new Promise((res) => {
    const shutdown = () => {
      for (const c of server.openStreams) c.abort();
      server.close(() => res());
      server.closeAllConnections?.();
    };
    process.once('SIGINT', shutdown);
    process.once('SIGTERM', shutdown);
  });
  await world.close();
  return 0;
}

module.exports = { createServer, main, UsageError };
