// `little serve`: a read-only view of a world over HTTP, and the inspector page.
//
//   GET /                        the inspector: inspector/index.html, style.css, and app.js with the
//                                ES modules it imports (each listed in MODULES)
//   GET /api/types               the event types the package knows, per vocabulary (knownEventTypes())
//   GET /api/runs                a page of runs, newest activity first, with event count, status, last
//                                time, cost: { runs, cursor }; ?status=a,b&limit=N&order=&before=&after=
//                                filter and order it, ?cursor= (the page before's) gives the next page
//   GET /api/runs/:id/events     Server-Sent Events: id = <sequence>:<eventId>, event = type, data =
//                                envelope; resumes after Last-Event-ID (or ?after=), either such an id
//                                or a bare sequence; a heartbeat comment every 15 s. A resume point
//                                whose event the run no longer holds there ends the stream with an
//                                `event: reset` (read the run again from the start)
//   GET /api/runs/:id/state      the materialized state (404 for a run with no events)
//
// Nothing here writes to the world, and every run's events, payloads and state can be read: who
// may ask is decided per request. A request that arrives on a loopback address must name this
// machine in its Host header (else 403: DNS rebinding). With a token, every request must carry
// it (else 401), as `Authorization: Bearer <token>` or the cookie that `/?token=<token>` sets; a
// request that arrives on any other address needs the token, and without one is refused. At most
// `maxStreams` event streams are open at once (503 past that); a client that takes nothing of its
// stream for `stallMs` is dropped. A client that goes away ends its subscription at once.
'use strict';

const crypto = require('node:crypto');
const http = require('node:http');
const { existsSync, readFileSync } = require('node:fs');
const { join } = require('node:path');
const { parseArgs } = require('node:util');
const { WORLD_HELP, WORLD_OPTIONS, UsageError, openWorld } = require('./world-args.js');

const HELP = `usage: little serve [--data-dir DIR | --database-url URL [--schema NAME]] [--port N] [--host H]
                   [--token T] [--max-streams N]

Serves the inspector at / and a read-only API (/api/types, /api/runs a page at a time,
/api/runs/:id/events as Server-Sent Events, /api/runs/:id/state) for a world, on 127.0.0.1 unless --host is given, port
4710 unless --port is given (0 picks a free port).

Whoever can reach it can read every run: its events, payloads and state (nothing can be changed).
On a loopback address (the default) it needs no token, and answers only requests that name this
machine (localhost, 127.0.0.1, [::1]) in their Host header, so that a web page elsewhere cannot
read the runs through your browser. With --host naming any other address (0.0.0.0, a LAN
address, a host name), every request needs a token: one is made at start and printed once, in
the URL to open (http://127.0.0.1:4710/?token=...); opening that URL sets a cookie and loads the
page without the token. Programs send it as "Authorization: Bearer <token>".

  --host H              the address to listen on (default: 127.0.0.1)
  --port N              the port (default: 4710; 0 picks a free one)
  --token T             require this token, on any address (default: $LITTLE_SERVE_TOKEN; on a
                        loopback address none, elsewhere a random one). 16 to 1024 visible ASCII
                        characters. The environment variable keeps it out of the process list.
  --max-streams N       event streams open at once, past which a stream gets 503 (default: 64)
${WORLD_HELP}`;

const HEARTBEAT_MS = 15_000;
/** Event streams open at once: each holds a subscription, and a page of events for a slow client. */
const MAX_STREAMS = 64;
/** How long a client may take nothing of its stream, its buffer full, before it is dropped. */
const STALL_MS = 60_000;
/** Pages of runs read at once, by every client together. */
const RUN_READINGS = 2;
/** Runs in a page of /api/runs unless ?limit= says otherwise. */
const RUNS_PAGE = 100;
/** The query parameters of /api/runs, and the queryRuns option each gives. */
const RUNS_PARAMS = { status: 'status', limit: 'limit', order: 'order', cursor: 'cursor', before: 'lastRecordedBefore', after: 'lastRecordedAfter' };

/**
 * A resume point of an event stream: `<sequence>:<eventId>`, as each event's `id:` line gives it,
 * or a bare `<sequence>` (no check of which event is there). Event ids are `evt_` and hex digits.
 */
const RESUME_POINT = /^(\d{1,16})(?::([A-Za-z0-9_-]{1,128}))?$/;

/** Thrown for a query parameter of /api/runs that cannot be a queryRuns option: 400. */
class BadQuery extends Error {}

/**
 * The queryRuns options a /api/runs query asks for: newest first and RUNS_PAGE runs unless it
 * says otherwise. An empty parameter is an absent one (`?cursor=` is the first page); an unknown
 * or repeated one is refused. The values themselves (a limit's range, an order's name, a time, a
 * cursor) are judged by queryRuns.
 */
function runsQuery(params) {
  const o = { order: 'newest', limit: RUNS_PAGE };
  for (const name of new Set(params.keys())) {
    if (!Object.hasOwn(RUNS_PARAMS, name)) throw new BadQuery(`unknown parameter ${JSON.stringify(name.slice(0, 40))}: /api/runs takes ${Object.keys(RUNS_PARAMS).join(', ')}`);
    const values = params.getAll(name);
    if (values.length > 1) throw new BadQuery(`${name} is given ${values.length} times`);
    const v = values[0];
    if (v === '') continue;
    if (name === 'status') o.status = v.split(',').map((s) => s.trim());
    else if (name === 'limit') {
      if (!/^\d{1,6}$/.test(v)) throw new BadQuery('limit: must be an integer from 1 to 10000');
      o.limit = Number(v);
    } else o[RUNS_PARAMS[name]] = v;
  }
  return o;
}

/** The environment variable that gives the token. */
const TOKEN_ENV = 'LITTLE_SERVE_TOKEN';
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

function send(res, status, body, type = 'application/json; charset=utf-8', headers = {}) {
  res.writeHead(status, {
    'content-type': type,
    'cache-control': 'no-store',
    'x-content-type-options': 'nosniff',
    'content-security-policy': CSP,
    'referrer-policy': 'no-referrer',
    ...headers,
  });
  res.end(body);
}

function sendJson(res, status, value, headers) {
  send(res, status, JSON.stringify(value), undefined, headers);
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

/** Whether an address (a socket's, or one to listen on; `::ffff:127.0.0.1` too) is a loopback one. */
function isLoopbackAddress(address) {
  return typeof address === 'string' && isLoopbackHost(address.includes(':') ? `[${address}]` : address);
}

/** A token's form: visible ASCII (it goes in a header and a cookie), long enough not to be guessed. */
const isToken = (token) => typeof token === 'string' && /^[\x21-\x7e]{16,1024}$/.test(token);
const TOKEN_FORM = '16 to 1024 visible ASCII characters (no spaces)';

/** A new token: 24 random bytes, as 48 hex digits. */
function generateToken() {
  return crypto.randomBytes(24).toString('hex');
}

const digest = (s) => crypto.createHash('sha256').update(s, 'utf8').digest();

/** The name of the cookie that holds the token: one per port, so that servers on one host differ. */
function cookieName(req) {
  let port = '';
  try {
    port = new URL(`http://${req.headers.host}/`).port;
  } catch {
    // No Host, or not a host: the port it came in on.
  }
  return `little_token_${port || req.socket.localPort || 'none'}`;
}

/** The value of the cookie `name` in the request, if any (the last, should there be several). */
function cookie(req, name) {
  let found;
  for (const part of (req.headers.cookie ?? '').split(';')) {
    const eq = part.indexOf('=');
    if (eq > 0 && part.slice(0, eq).trim() === name) found = part.slice(eq + 1).trim();
  }
  if (found === undefined) return undefined;
  try {
    return decodeURIComponent(found);
  } catch {
    return undefined;
  }
}

/**
 * Create the server for an open world. Resolves nothing by itself; call listen().
 *
 * A request that arrives on a loopback address must name this machine in its Host header (else
 * 403): a web page elsewhere could otherwise point a name of its own at 127.0.0.1 (DNS rebinding)
 * and read every run through the visitor's browser. Given a `token`, every request must carry it
 * (else 401); without one, a request that arrives on any other address is refused (401), so the
 * server answers loopback alone. The token is compared in constant time, as digests of equal
 * length.
 */
function createServer(lib, world, { inspectorDir = join(__dirname, '..', 'inspector'), heartbeatMs = HEARTBEAT_MS, token, maxStreams = MAX_STREAMS, stallMs = STALL_MS } = {}) {
  if (token !== undefined && !isToken(token)) throw new TypeError(`the token must be ${TOKEN_FORM}`);
  if (!Number.isSafeInteger(maxStreams) || maxStreams < 1) throw new RangeError(`maxStreams must be a positive integer, not ${maxStreams}`);
  const expected = token === undefined ? undefined : digest(token);
  const matches = (presented) => expected !== undefined && typeof presented === 'string' && crypto.timingSafeEqual(digest(presented), expected);
  const open = new Set();
  // A page of runs costs its own rows, but the inspector asks for the same first page every few
  // seconds from each tab. Requests for a page while the same page is being read share the next
  // reading of it, begun when that one ends, so that every answer is of a reading begun after
  // the request came (it sees what was appended before), and each page is read by one at a time.
  const readings = new Map(); // query key -> { current, queued }
  // At most RUN_READINGS pages are read at once, whatever is asked: each read takes one of the
  // few threads (libuv's pool) that event streams read with too. The rest wait their turn.
  let busy = 0;
  const turns = [];
  const readPage = async (opts) => {
    if (busy < RUN_READINGS) busy += 1;
    else await new Promise((r) => turns.push(r));
    try {
      return await lib.queryRuns(world, opts);
    } finally {
      // The slot passes to the next in line, or is freed.
      const next = turns.shift();
      if (next) next();
      else busy -= 1;
    }
  };
  const queryRunsFresh = (opts) => {
    const key = JSON.stringify(opts);
    let slot = readings.get(key);
    if (slot === undefined) readings.set(key, (slot = { current: undefined, queued: undefined }));
    const begin = () => {
      const reading = readPage(opts);
      slot.current = reading;
      const done = () => {
        if (slot.current !== reading) return;
        slot.current = undefined;
        if (slot.queued === undefined) readings.delete(key);
      };
      reading.then(done, done);
      return reading;
    };
    if (slot.current === undefined) return begin();
    const ended = () => {
      slot.queued = undefined;
      return begin();
    };
    return (slot.queued ??= slot.current.then(ended, ended));
  };
  const handle = async (req, res) => {
    try {
      // Judged by the address this request arrived on, whatever the server listens on: on a
      // loopback one, only a name of this machine is answered.
      const loopback = isLoopbackAddress(req.socket.localAddress);
      const host = req.headers.host;
      if (loopback && host !== undefined && !isLoopbackHost(host)) {
        return sendJson(res, 403, { error: `Host ${JSON.stringify(host.slice(0, 100))} does not name this machine: this server answers localhost, 127.0.0.1 and [::1] on its loopback address` });
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
      if (loopback && absolute && !isLoopbackHost(url.host)) {
        return sendJson(res, 403, { error: `${url.hostname.slice(0, 100)} is not this machine` });
      }
      const file = STATIC[url.pathname];
      if (expected !== undefined || !loopback) {
        const name = cookieName(req);
        // The page's URL as printed: the token becomes a cookie, and the page is loaded again
        // without it, so that it stays out of the history and of what the page's address shows.
        if (file && url.searchParams.has('token') && (req.method === 'GET' || req.method === 'HEAD')) {
          if (!matches(url.searchParams.get('token'))) return refuse(res, file, expected !== undefined);
          url.searchParams.delete('token');
          res.writeHead(303, {
            location: `${url.pathname}${url.search}`,
            'set-cookie': `${name}=${encodeURIComponent(token)}; Path=/; HttpOnly; SameSite=Strict`,
            'cache-control': 'no-store',
            'referrer-policy': 'no-referrer',
          });
          return res.end();
        }
        const bearer = /^Bearer[ \t]+(\S+)[ \t]*$/i.exec(req.headers.authorization ?? '');
        if (!matches(bearer?.[1]) && !matches(cookie(req, name))) return refuse(res, file, expected !== undefined);
      }
      if (req.method !== 'GET' && req.method !== 'HEAD') {
        res.setHeader('allow', 'GET, HEAD');
        return sendJson(res, 405, { error: 'read-only: only GET and HEAD are served' });
      }
      if (file) {
        const path = join(inspectorDir, file[0]);
        if (!existsSync(path)) return sendJson(res, 404, { error: `${file[0]} is not installed` });
        return send(res, 200, readFileSync(path), file[1]);
      }
      if (url.pathname === '/api/types') return sendJson(res, 200, lib.knownEventTypes());
      if (url.pathname === '/api/runs') {
        let page;
        try {
          page = await queryRunsFresh(runsQuery(url.searchParams));
        } catch (err) {
          // A parameter queryRuns refuses (a limit out of range, a cursor of another order).
          if (err instanceof BadQuery) return sendJson(res, 400, { error: err.message });
          if (err && err.code === 'EVENT_VALIDATION') return sendJson(res, 400, { error: String(err.message).replace(/^lastRecorded(Before|After):/, (_, w) => `${w.toLowerCase()}:`) });
          throw err;
        }
        return sendJson(res, 200, { runs: page.runs, cursor: page.cursor });
      }
      const m = /^\/api\/runs\/([^/]+)\/(events|state)$/.exec(url.pathname);
      if (!m) return sendJson(res, 404, { error: `no such path: ${url.pathname}` });
      let id;
      try {
        id = decodeURIComponent(m[1]);
      } catch {
        id = '';
      }
      if (!lib.isRunId(id) && !lib.isSessionId(id)) return sendJson(res, 400, { error: `invalid run id: expected run_ (or ses_) followed by 1-80 of [A-Za-z0-9_-]` });
      if (m[2] === 'state') {
        // A run with no events is no run (a mistyped id, most often), as for `little replay`.
        if ((await lib.listEvents(world, id, { limit: 1 })).length === 0) return sendJson(res, 404, { error: `${id} has no events` });
        return sendJson(res, 200, await lib.materializeRunState(world, id));
      }
      return streamEvents(lib, world, id, req, res, url, open, { heartbeatMs, maxStreams, stallMs });
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

/** 401: the page's files get a line of text, the API its JSON. The message never holds a token. */
function refuse(res, file, hasToken) {
  const message = hasToken
    ? 'this server needs its token: open the URL little serve printed (.../?token=...), or send "Authorization: Bearer <token>"'
    : 'this server has no token, and answers only on its loopback address (start it with --token to serve others)';
  const headers = { 'www-authenticate': 'Bearer realm="little serve"' };
  if (file) return send(res, 401, `${message}\n`, 'text/plain; charset=utf-8', headers);
  return sendJson(res, 401, { error: message }, headers);
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

/**
 * One client's event stream. What it buffers for a slow client is bounded: the next event is
 * written only once the response's buffer is below its high-water mark (16 KiB), and no heartbeat
 * is added to a full one, so a client holds at most that, one event and the subscription's page.
 * A client whose buffer stays full for `stallMs` (it takes nothing) is dropped, and its slot
 * freed: an EventSource that comes back resumes after Last-Event-ID.
 */
async function streamEvents(lib, world, id, req, res, url, open, { heartbeatMs, maxStreams, stallMs }) {
  // An empty Last-Event-ID is no resume point (EventSource never sends one).
  const header = req.headers['last-event-id'] || undefined;
  const resumeFrom = header ?? url.searchParams.get('after') ?? '0';
  const point = RESUME_POINT.exec(String(resumeFrom));
  const after = point ? Number(point[1]) : NaN;
  const afterEventId = point?.[2];
  if (!Number.isSafeInteger(after) || (afterEventId !== undefined && after === 0)) {
    return sendJson(res, 400, { error: 'Last-Event-ID / after must be a sequence number, or <sequence>:<eventId> as an id: line gives it' });
  }
  // Counted and taken at once, before any await: two requests cannot both take the last slot.
  if (req.method !== 'HEAD' && open.size >= maxStreams) {
    return sendJson(res, 503, { error: `${maxStreams} event streams are open, the most this server serves at once: try again later` }, { 'retry-after': '5' });
  }
  res.writeHead(200, {
    'content-type': 'text/event-stream; charset=utf-8',
    'cache-control': 'no-store',
    connection: 'keep-alive',
    'x-accel-buffering': 'no',
  });
  // A HEAD request gets the headers a GET would, and no stream.
  if (req.method === 'HEAD') return res.end();
  const controller = new AbortController();
  open.add(controller);
  // Armed while the buffer is full; a drain disarms it.
  let stall;
  const write = (text) => {
    if (res.write(text)) return;
    stall ??= setTimeout(() => res.destroy(), stallMs);
  };
  const unstall = () => {
    clearTimeout(stall);
    stall = undefined;
  };
  res.on('drain', unstall);
  write('retry: 1000\n\n');
  const heartbeat = setInterval(() => {
    if (!res.writableNeedDrain) write(': heartbeat\n\n');
  }, heartbeatMs);
  const stop = () => controller.abort();
  req.on('close', stop);
  res.on('close', stop);
  try {
    // With the event id, the subscription first checks that the run still holds that event at
    // that sequence: a run deleted and started again, or a store that lost commits, does not.
    const opts = { afterSequence: after, signal: controller.signal };
    if (afterEventId !== undefined) opts.afterEventId = afterEventId;
    for await (const e of lib.subscribe(world, id, opts)) {
      write(`id: ${e.sequence}:${e.eventId}\nevent: ${e.type}\ndata: ${lib.canonicalize(e)}\n\n`);
      if (res.writableNeedDrain && !controller.signal.aborted) await drained(res);
    }
  } catch (err) {
    // What the client holds (or resumed from) is no longer the run's history: a last event that
    // says so, then the end, so that it reads the run again from the start rather than resuming.
    // Its data is no envelope (it has no eventId): that tells it from an event whose type is
    // `reset`. The error is known by its code and the event id it names (the package may be
    // another copy, with classes of its own): a damaged store's own EVENT_LOG_CORRUPT names none,
    // and a reload would only meet it again, so it ends the stream as any other error does.
    if (!(err && err.code === 'EVENT_LOG_CORRUPT' && typeof err.details?.eventId === 'string')) throw err;
    const sequence = typeof err.sequence === 'number' ? err.sequence : after;
    const reset = {
      error: `${id}: the event at sequence ${sequence} is no longer the one this stream had reached (the run was deleted and started again, or its store lost commits): read the run again from the start`,
      code: 'EVENT_LOG_CORRUPT',
      runId: id,
      sequence,
    };
    if (!res.destroyed) write(`event: reset\ndata: ${JSON.stringify(reset)}\n\n`);
  } finally {
    clearInterval(heartbeat);
    unstall();
    open.delete(controller);
    req.off('close', stop);
    res.off('drain', unstall);
    res.end();
  }
}

async function main(argv, env = process.env) {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      options: {
        ...WORLD_OPTIONS,
        port: { type: 'string' },
        host: { type: 'string' },
        token: { type: 'string' },
        'max-streams': { type: 'string' },
        help: { type: 'boolean', short: 'h' },
      },
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
  const maxStreams = Number(parsed.values['max-streams'] ?? MAX_STREAMS);
  if (!Number.isSafeInteger(maxStreams) || maxStreams < 1) throw new UsageError(`invalid --max-streams: ${parsed.values['max-streams']}`);
  const host = parsed.values.host ?? '127.0.0.1';
  // A token given is required on every address. Without one, a server that can be reached beyond
  // loopback makes its own: judged by the name given, so a name that is not a loopback literal
  // or `localhost` (whatever it resolves to) gets one.
  const given = parsed.values.token ?? (env[TOKEN_ENV] || undefined);
  if (given !== undefined && !isToken(given)) {
    throw new UsageError(`${parsed.values.token !== undefined ? '--token' : TOKEN_ENV} must be ${TOKEN_FORM}`);
  }
  const beyondLoopback = !isLoopbackAddress(host);
  const token = given ?? (beyondLoopback ? generateToken() : undefined);
  const lib = require('..');
  const { world, label } = openWorld(lib, parsed.values);
  const server = createServer(lib, world, { token, maxStreams });
  await new Promise((res, rej) => server.once('error', rej).listen(port, host, res));
  const addr = server.address();
  // The URL to open: on a wildcard address, the loopback one (another machine uses this one's
  // name or address instead). A token made here is printed once, in it, and nowhere else; one
  // given is not printed.
  const wildcard = host === '0.0.0.0' || host === '::' || host === '[::]';
  const shown = wildcard ? '127.0.0.1' : host.includes(':') && !host.startsWith('[') ? `[${host}]` : host;
  const query = given === undefined && token !== undefined ? `?token=${token}` : '';
  const from = given === undefined ? '' : parsed.values.token !== undefined ? ' given with --token' : ` in ${TOKEN_ENV}`;
  const elsewhere = wildcard ? "; listening on every address: from another machine, use this machine's name or address in place of 127.0.0.1" : '';
  const access = token === undefined ? 'loopback only, no token' : `every request needs the token${from}${elsewhere}`;
  process.stdout.write(`little serve: http://${shown}:${addr.port}/${query} (world ${label}; ${access})\n`);
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
