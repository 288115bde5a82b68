#!/usr/bin/env node
// Mock server for developing the inspector page. Development only: Node built-ins, no dependencies.
//
//   node inspector/dev-server.mjs [port]        (default 8787, on 127.0.0.1)
//
// Serves index.html, app.js and style.css beside this file, and a fake API shaped like
// `little serve`'s:
//   GET /api/runs                  runs, newest activity first
//   GET /api/runs/:id/events       Server-Sent Events (backlog, then live; Last-Event-ID / ?after=N)
//   GET /api/runs/:id/state        materialized state (a small JS fold mirroring the Rust rules)
// Two runs: run_demo_completed (finished, priced, with a parallel group, a retry and an unpriced
// model) and run_demo_live (gains an event every LIVE_TICK_MS, default 1000 ms, with occasional
// unknown-type events, and every 30th live event held back from live delivery for 2.5 s so the
// page sees a sequence gap, then the late event). `--huge` adds run_demo_huge (6,000 events).
// Dev helpers: POST /__mock/disconnect drops every open SSE connection;
//              POST /__mock/append?run=run_x&type=T appends an event with the JSON body as payload.

import http from 'node:http';
import { readFile } from 'node:fs/promises';
import { createHash } from 'node:crypto';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const PORT = Number(args.find((a) => /^\d+$/.test(a)) ?? 8787);
const HUGE = args.includes('--huge');
const LIVE_TICK_MS = Number(process.env.LIVE_TICK_MS ?? 1000);
const HEARTBEAT_MS = Number(process.env.HEARTBEAT_MS ?? 15000);
const HOLD_EVERY = 30; // every Nth live event is held back to exercise gap handling
const HOLD_MS = 2500;
const RUN_ID = /^run_[A-Za-z0-9_-]{1,80}$/;

// ---------------------------------------------------------------- pricing (subset of the bundled registry)
const PRICING_AS_OF = '2026-11-22';
const RATES = {
  'openai/gpt-5': [1.25, 10, 0.125],
  'openai/gpt-5-mini': [0.25, 2, 0.025],
  'anthropic/claude-sonnet-4-5': [3, 15, 0.3],
  'google/gemini-2.5-pro': [1.25, 10, 0.125],
};

function emptyUsage() {
  return { inputTokens: 0, outputTokens: 0, cachedInputTokens: 0, reasoningTokens: 0, cost: 0, pricedCalls: 0, unpricedCalls: 0 };
}
function addCall(u, t, cost) {
  u.inputTokens += t.inputTokens;
  u.outputTokens += t.outputTokens;
  u.cachedInputTokens += t.cachedInputTokens ?? 0;
  u.reasoningTokens += t.reasoningTokens ?? 0;
  if (cost == null) u.unpricedCalls += 1;
  else { u.cost += cost; u.pricedCalls += 1; }
}
function usageJson(u) {
  const { cost, ...rest } = u;
  const costUsd = u.pricedCalls === 0 && u.unpricedCalls > 0 ? null : Math.round(cost * 1e9) / 1e9;
  return { ...rest, costUsd };
}

// ---------------------------------------------------------------- canonical-ish JSON and ids
function canonical(v) {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v && typeof v === 'object') {
    return `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`).join(',')}}`;
  }
  return JSON.stringify(v);
}
const sha = (s) => createHash('sha256').update(s).digest('hex');

// ---------------------------------------------------------------- the store
/** runId -> { events: envelope[], clients: Set<client> } */
const runs = new Map();
const clients = new Set();

function runOf(runId) {
  let r = runs.get(runId);
  if (!r) { r = { events: [] }; runs.set(runId, r); }
  return r;
}

function append(runId, type, payload, { at = new Date(), hold = false, key } = {}) {
  const r = runOf(runId);
  const sequence = r.events.length + 1;
  const env = {
    eventId: `evt_${sha(canonical({ runId, sequence, type, payload })).slice(0, 16)}`,
    runId, sequence, type, recordedAt: new Date(at).toISOString(), payload,
  };
  if (key) {
    env.appendIdempotencyKey = key;
    env.canonicalRequestDigest = `sha256:${sha(canonical({ runId, type, payload }))}`;
  }
  r.events.push(env);
  const deliver = () => { for (const c of clients) if (c.runId === runId) c.send(env); };
  if (hold) setTimeout(deliver, HOLD_MS); // stored now, pushed live late: a gap, then the late event
  else deliver();
  return env;
}

// ---------------------------------------------------------------- the fold (mirrors src/core/materialize)
function materialize(runId) {
  const r = runs.get(runId);
  const st = { runId, status: 'pending', eventCount: 0 };
  const usage = emptyUsage();
  const byModel = new Map();
  const steps = new Map();
  const artifacts = [];
  const sessions = [];
  const drift = [];
  let priced = false;
  const touch = (at) => { if (st.status === 'pending') { st.status = 'running'; st.startedAt ??= at; } };
  const step = (p) => {
    if (!steps.has(p)) steps.set(p, { stepPath: p, status: 'pending', attempts: 0, usage: emptyUsage() });
    return steps.get(p);
  };
  for (const e of r ? r.events : []) {
    const p = e.payload, t = e.type, at = e.recordedAt;
    st.eventCount += 1;
    st.lastRecordedAt = at;
    for (const m of JSON.stringify(p).matchAll(/"(artifact:\/\/art_[0-9a-f]{16})"/g)) {
      if (!artifacts.includes(m[1])) artifacts.push(m[1]);
    }
    if (t === 'RunStarted') {
      st.status = 'running'; st.startedAt ??= at; delete st.finishedAt;
      if (p.workflowVersionId) st.workflowVersionId = p.workflowVersionId;
    } else if (t === 'RunCompleted') {
      st.status = 'completed'; st.finishedAt = at;
      if ('output' in p) st.output = p.output;
      if (p.outputRef) st.outputRef = p.outputRef;
    } else if (t === 'RunFailed') {
      st.status = 'failed'; st.finishedAt = at; st.error = p.error;
    } else if (/^(Step|Parallel)/.test(t) && p.stepPath) {
      touch(at);
      const s = step(p.stepPath);
      if (t.startsWith('ParallelGroup')) s.stepKind = 'parallel.group';
      else if (t.startsWith('ParallelBranch')) s.stepKind = 'parallel.branch';
      else if (p.stepKind) s.stepKind = p.stepKind;
      if (p.groupId) s.groupId = p.groupId;
      if (/Started$|Scheduled$/.test(t)) {
        s.status = 'running'; s.attempts += 1; s.startedAt ??= at;
        delete s.finishedAt; delete s.error;
      } else if (/Completed$/.test(t)) {
        s.status = 'completed'; s.finishedAt = at; delete s.error;
        if ('output' in p) s.output = p.output;
        if (p.outputRef) s.outputRef = p.outputRef;
      } else if (/Failed$/.test(t)) {
        s.status = 'failed'; s.finishedAt = at; s.error = p.error;
      }
    } else if (t === 'harness.session.started') {
      const prev = [...sessions].reverse().find((x) => x.role === p.role);
      if (prev && prev.manifestHash !== p.manifestHash) {
        drift.push({ sequence: e.sequence, role: p.role, reason: 'changed', manifestHash: p.manifestHash, expected: prev.manifestHash });
      }
      sessions.push({ sequence: e.sequence, role: p.role, runId: p.runId, manifestHash: p.manifestHash, status: 'running' });
    } else if (t === 'harness.session.completed' || t === 'harness.session.failed') {
      const s = [...sessions].reverse().find((x) => x.runId === p.runId && x.status === 'running');
      if (s) s.status = t.endsWith('completed') ? 'completed' : 'failed';
    } else if (t === 'harness.model.responded') {
      priced = true;
      const key = `${p.model.provider}/${p.model.modelId}`;
      const tok = p.response.usage;
      const rate = RATES[key];
      const cached = tok.cachedInputTokens ?? 0;
      const cost = rate ? ((tok.inputTokens - cached) * rate[0] + cached * rate[2] + tok.outputTokens * rate[1]) / 1e6 : null;
      addCall(usage, tok, cost);
      if (!byModel.has(key)) byModel.set(key, emptyUsage());
      addCall(byModel.get(key), tok, cost);
      if (p.stepPath) {
        const s = step(p.stepPath);
        if (s.status === 'pending') s.status = 'running';
        addCall(s.usage, tok, cost);
      }
    } else if (t === 'OuterLoopCycleCompleted') {
      st.outerLoop = { outerLoopId: p.outerLoopId, cycleNumber: p.cycleNumber, lastKind: p.supervise?.kind ?? '' };
      if (p.supervise?.kind === 'done') { st.status = 'completed'; st.finishedAt = at; }
    }
  }
  st.usage = usageJson(usage);
  st.usageByModel = Object.fromEntries([...byModel].sort().map(([k, u]) => [k, usageJson(u)]));
  st.steps = Object.fromEntries([...steps].sort().map(([k, s]) => [k, { ...s, usage: usageJson(s.usage) }]));
  st.artifacts = artifacts;
  st.sessions = sessions;
  st.manifestDrift = drift;
  if (priced) st.pricingAsOf = PRICING_AS_OF;
  return st;
}

function runSummaries() {
  return [...runs]
    .filter(([, r]) => r.events.length > 0)
    .map(([runId, r]) => {
      const st = materialize(runId);
      return {
        runId, eventCount: r.events.length, lastSequence: r.events.length, status: st.status,
        firstRecordedAt: r.events[0].recordedAt, lastRecordedAt: r.events.at(-1).recordedAt,
        costUsd: st.usage.costUsd,
      };
    })
    .sort((a, b) => (a.lastRecordedAt < b.lastRecordedAt ? 1 : a.lastRecordedAt > b.lastRecordedAt ? -1 : 0));
}

// ---------------------------------------------------------------- demo data
const usage = (inputTokens, outputTokens, cachedInputTokens = 0, reasoningTokens = 0) =>
  ({ inputTokens, outputTokens, cachedInputTokens, reasoningTokens });
const model = (key) => { const [provider, modelId] = key.split('/'); return { provider, modelId }; };
let callNo = 0;
function responded(runId, stepPath, key, u, text, at) {
  callNo += 1;
  return append(runId, 'harness.model.responded', {
    turn: 1 + (callNo % 4), callId: `call_${callNo}`, stepPath, model: model(key),
    response: { text, usage: u },
  }, { at, key: `${runId}:call_${callNo}` });
}

function seedCompleted() {
  const id = 'run_demo_completed';
  let t = Date.now() - 3_600_000;
  const at = (ms = 900) => (t += ms);
  const manifest = { role: 'planner', tools: ['web.search', 'code.run'], model: 'openai/gpt-5' };
  append(id, 'RunStarted', { workflowVersionId: 'wfv_research_v3', input: { topic: 'durable event logs', depth: 2 } }, { at: at() });
  append(id, 'harness.session.started', {
    runId: id, role: 'planner', task: { kind: 'plan' }, manifest,
    manifestHash: `sha256:${sha(canonical(manifest))}`,
  }, { at: at(), key: `${id}:session:1` });
  append(id, 'StepStarted', { stepPath: 'plan', stepKind: 'ai.generate', attempt: 1 }, { at: at() });
  append(id, 'harness.model.called', {
    turn: 1, promptHash: `sha256:${sha('plan')}`,
    request: { model: 'gpt-5', messages: [{ role: 'user', content: 'Plan research on durable event logs' }], tools: [] },
  }, { at: at(), key: `${id}:called:1` });
  responded(id, 'plan', 'openai/gpt-5', usage(4200, 1310, 1024, 512), 'Plan: 3 branches (web, papers, code).', at(4200));
  append(id, 'StepCompleted', { stepPath: 'plan', output: { branches: ['web', 'papers', 'code'] } }, { at: at() });
  append(id, 'ParallelGroupStarted', { stepPath: 'research', groupId: 'grp_research', branchCount: 3 }, { at: at() });
  for (const b of ['web', 'papers', 'code']) {
    append(id, 'ParallelBranchScheduled', { stepPath: `research/${b}`, groupId: 'grp_research', branch: b }, { at: at(40) });
  }
  append(id, 'harness.tool_call.started', { turn: 1, callId: 'tc_1', caller: 'model', toolName: 'web.search', args: { q: 'SQLite WAL group commit' } }, { at: at(), key: `${id}:tc_1` });
  append(id, 'harness.tool_call.succeeded', { callId: 'tc_1', durationMs: 812.4, result: { hits: 12, top: 'https://sqlite.org/wal.html' } }, { at: at(812), key: `${id}:tc_1:ok` });
  responded(id, 'research/web', 'openai/gpt-5-mini', usage(9100, 2200, 4096, 0), 'Found 12 sources; WAL with synchronous=FULL…', at(2100));
  append(id, 'StepStarted', { stepPath: 'research/papers/fetch', stepKind: 'tool.call', attempt: 1 }, { at: at() });
  append(id, 'StepFailed', { stepPath: 'research/papers/fetch', error: { message: 'HTTP 503 from arxiv export API', code: 'upstream_unavailable' } }, { at: at(1500) });
  append(id, 'StepStarted', { stepPath: 'research/papers/fetch', stepKind: 'tool.call', attempt: 2 }, { at: at(2000) });
  append(id, 'StepCompleted', { stepPath: 'research/papers/fetch', output: { papers: 4 } }, { at: at(1200) });
  responded(id, 'research/papers', 'anthropic/claude-sonnet-4-5', usage(15300, 3100, 8000, 0), 'Four papers on event sourcing…', at(5200));
  append(id, 'harness.execute_step.started', { stepPath: 'research/code', stepKind: 'code.run', inputHash: `sha256:${sha('code-in')}` }, { at: at(), key: `${id}:exec:1` });
  append(id, 'harness.execute_step.succeeded', { stepPath: 'research/code', outputHash: `sha256:${sha('code-out')}`, durationMs: 3380 }, { at: at(3380), key: `${id}:exec:1:ok` });
  responded(id, 'research/code', 'openai/gpt-5-mini', usage(6200, 900, 0, 256), 'Benchmark ran: 48k appends/s.', at(1800));
  for (const b of ['web', 'papers', 'code']) {
    append(id, 'ParallelBranchCompleted', { stepPath: `research/${b}`, groupId: 'grp_research', branch: b }, { at: at(60) });
  }
  append(id, 'ParallelGroupCompleted', { stepPath: 'research', groupId: 'grp_research', branchCount: 3 }, { at: at() });
  append(id, 'StepStarted', { stepPath: 'summarize', stepKind: 'ai.generate', attempt: 1 }, { at: at() });
  responded(id, 'summarize', 'anthropic/claude-sonnet-4-5', usage(21000, 2600, 12000, 0), 'Summary draft…', at(6100));
  responded(id, 'summarize', 'local/llama-3.1-8b', usage(2600, 800, 0, 0), 'Style pass (local model, unpriced).', at(2400));
  responded(id, 'summarize', 'local/llama-3.1-8b', usage(2700, 760, 0, 0), 'Second style pass.', at(2300));
  append(id, 'StepCompleted', { stepPath: 'summarize', output: { words: 812, title: 'Durable event logs, <b>in brief</b>' } }, { at: at() });
  append(id, 'harness.session.completed', { runId: id, usage: usage(61100, 11670, 29120, 768) }, { at: at(), key: `${id}:session:1:done` });
  append(id, 'RunCompleted', { output: { report: 'artifact://art_00c0ffee00c0ffee', words: 812 } }, { at: at() });
}

function seedLive() {
  const id = 'run_demo_live';
  append(id, 'RunStarted', { workflowVersionId: 'wfv_agent_loop_v1', input: { goal: 'keep improving the draft' } }, { at: Date.now() - 5000 });
  append(id, 'run:started', { workflowId: '5b0f7f0e-7c1e-4b8e-9d1e-2f1a3c4d5e6f', inputs: { goal: 'keep improving the draft' }, executionMode: 'local' }, { at: Date.now() - 4900 });
  const gen = liveScript(id);
  let n = 0;
  setInterval(() => {
    const next = gen.next().value;
    n += 1;
    append(id, next.type, next.payload, { hold: n % HOLD_EVERY === 5, key: next.key });
  }, LIVE_TICK_MS).unref();
}

function* liveScript(id) {
  let micro = 0;
  for (let i = 1; ; i++) {
    const research = `cycle-${i}/research`;
    const draft = `cycle-${i}/draft`;
    yield { type: 'StepStarted', payload: { stepPath: research, stepKind: 'ai.generate', attempt: 1 } };
    yield { type: 'node:started', payload: { nodeId: research, nodeType: 'agent' } };
    yield { type: 'agent:token', payload: { nodeId: research, token: 'Searching', model: 'gpt-5-mini' } };
    yield { type: 'harness.tool_call.started', payload: { turn: 1, callId: `tc_${i}`, caller: 'model', toolName: 'web.search', args: { q: `iteration ${i} <script>alert(1)</script>` } }, key: `${id}:tc_${i}` };
    yield { type: 'harness.tool_call.succeeded', payload: { callId: `tc_${i}`, durationMs: 420 + i, result: { hits: i % 7 } }, key: `${id}:tc_${i}:ok` };
    callNo += 1;
    yield {
      type: 'harness.model.responded', key: `${id}:call_${callNo}`,
      payload: { turn: 1, callId: `call_${callNo}`, stepPath: research, model: model('openai/gpt-5-mini'), response: { text: `Notes for cycle ${i}`, usage: usage(3000 + 150 * i, 600, 1024, 128) } },
    };
    if (i % 2 === 1) yield { type: 'my.custom.fact', payload: { note: `custom fact from cycle ${i}`, cycle: i } };
    yield { type: 'StepCompleted', payload: { stepPath: research, output: { notes: i } } };
    yield { type: 'StepStarted', payload: { stepPath: draft, stepKind: 'ai.generate', attempt: 1 } };
    const key = i % 4 === 0 ? 'local/qwen2.5-7b' : 'anthropic/claude-sonnet-4-5';
    callNo += 1;
    yield {
      type: 'harness.model.responded', key: `${id}:call_${callNo}`,
      payload: { turn: 2, callId: `call_${callNo}`, stepPath: draft, model: model(key), response: { text: `Draft v${i}`, usage: usage(8000 + 400 * i, 1500, 4000, 0) } },
    };
    const cost = 2500 + 10 * i;
    micro += cost;
    yield { type: 'cost:updated', payload: { nodeId: draft, model: key, inputTokens: 8000 + 400 * i, outputTokens: 1500, costMicrocents: cost, cumulativeCostMicrocents: micro } };
    if (i % 3 === 0) {
      yield { type: 'StepFailed', payload: { stepPath: draft, error: { message: `validator rejected draft v${i}`, code: 'validation' } } };
      yield { type: 'node:retrying', payload: { nodeId: draft, attemptNumber: 1, error: { code: 'validation', message: 'retrying', retryable: true } } };
      yield { type: 'StepStarted', payload: { stepPath: draft, stepKind: 'ai.generate', attempt: 2 } };
    }
    if (i % 5 === 0) yield { type: 'acme.audit/v2', payload: { actor: 'bot', detail: { nested: [1, 2, 3] } } };
    yield { type: 'StepCompleted', payload: { stepPath: draft, output: { words: 300 + i } } };
    yield { type: 'node:completed', payload: { nodeId: draft, output: { ok: true }, tokensUsed: { input: 8000, output: 1500 }, durationMs: 3000 } };
  }
}

function seedHuge() {
  const id = 'run_demo_huge';
  let t = Date.now() - 7_200_000;
  append(id, 'RunStarted', { input: { n: 6000 } }, { at: (t += 10) });
  for (let i = 1; runOf(id).events.length < 5999; i++) {
    const p = `batch/${String(Math.ceil(i / 50)).padStart(3, '0')}`;
    if (i % 50 === 1) append(id, 'StepStarted', { stepPath: p, stepKind: 'batch' }, { at: (t += 10) });
    else if (i % 50 === 0) append(id, 'StepCompleted', { stepPath: p }, { at: (t += 10) });
    else if (i % 7 === 0) responded(id, p, 'openai/gpt-5-mini', usage(500, 100), `item ${i}`, (t += 10));
    else append(id, i % 11 === 0 ? 'my.custom.fact' : 'agent:token', { nodeId: p, token: `tok${i}`, model: 'gpt-5-mini' }, { at: (t += 10) });
  }
  append(id, 'RunCompleted', { output: { done: true } }, { at: (t += 10) });
}

seedCompleted();
seedLive();
if (HUGE) seedHuge();

// ---------------------------------------------------------------- HTTP
const STATIC = {
  '/': ['index.html', 'text/html; charset=utf-8'],
  '/index.html': ['index.html', 'text/html; charset=utf-8'],
  '/app.js': ['app.js', 'text/javascript; charset=utf-8'],
  '/style.css': ['style.css', 'text/css; charset=utf-8'],
};
const SECURITY_HEADERS = {
  'x-content-type-options': 'nosniff',
  'content-security-policy': "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
  'referrer-policy': 'no-referrer',
};

function sendJson(res, status, body) {
  res.writeHead(status, { 'content-type': 'application/json; charset=utf-8', 'cache-control': 'no-store', ...SECURITY_HEADERS });
  res.end(JSON.stringify(body));
}

function parseAfter(req, url) {
  // Last-Event-ID (sent by EventSource on its own reconnects) wins over ?after=, which may be stale.
  const raw = req.headers['last-event-id'] ?? url.searchParams.get('after') ?? '0';
  return /^\d{1,15}$/.test(String(raw).trim()) ? Number(String(raw).trim()) : NaN;
}

function serveEvents(req, res, runId, url) {
  const after = parseAfter(req, url);
  if (!Number.isSafeInteger(after)) return sendJson(res, 400, { error: 'after / Last-Event-ID must be a non-negative integer' });
  res.writeHead(200, {
    'content-type': 'text/event-stream; charset=utf-8',
    'cache-control': 'no-store',
    connection: 'keep-alive',
    'x-accel-buffering': 'no',
    ...SECURITY_HEADERS,
  });
  res.write('retry: 2000\n\n');
  const frame = (e) => `id: ${e.sequence}\nevent: ${e.type.replace(/[\r\n]/g, ' ')}\ndata: ${JSON.stringify(e)}\n\n`;
  const client = { runId, res, send: (e) => res.write(frame(e)) };
  const backlog = runOf(runId).events.slice(after);
  let chunk = '';
  for (const e of backlog) {
    chunk += frame(e);
    if (chunk.length > 64 * 1024) { res.write(chunk); chunk = ''; }
  }
  if (chunk) res.write(chunk);
  clients.add(client);
  const beat = setInterval(() => res.write(': heartbeat\n\n'), HEARTBEAT_MS);
  const done = () => { clearInterval(beat); clients.delete(client); };
  req.on('close', done);
  res.on('error', done);
}

const server = http.createServer(async (req, res) => {
  const url = new URL(req.url, 'http://localhost');
  const path = url.pathname;
  try {
    if (req.method === 'POST' && path === '/__mock/disconnect') {
      const n = clients.size;
      for (const c of [...clients]) c.res.destroy();
      return sendJson(res, 200, { dropped: n });
    }
    if (req.method === 'POST' && path === '/__mock/append') {
      const runId = url.searchParams.get('run') ?? '';
      const type = url.searchParams.get('type') ?? 'my.custom.fact';
      if (!RUN_ID.test(runId)) return sendJson(res, 400, { error: 'bad run id' });
      let body = '';
      for await (const c of req) body += c;
      const env = append(runId, type, body ? JSON.parse(body) : {});
      return sendJson(res, 200, env);
    }
    if (req.method !== 'GET' && req.method !== 'HEAD') return sendJson(res, 405, { error: 'method not allowed' });
    if (STATIC[path]) {
      const [file, type] = STATIC[path];
      const body = await readFile(join(HERE, file));
      res.writeHead(200, { 'content-type': type, 'cache-control': 'no-cache', ...SECURITY_HEADERS });
      return res.end(body);
    }
    if (path === '/api/runs') return sendJson(res, 200, runSummaries());
    const m = /^\/api\/runs\/([^/]+)\/(events|state)$/.exec(path);
    if (m) {
      let runId;
      try { runId = decodeURIComponent(m[1]); } catch { runId = ''; }
      if (!RUN_ID.test(runId)) return sendJson(res, 400, { error: 'invalid run id: expected run_ followed by 1-80 of [A-Za-z0-9_-]' });
      if (m[2] === 'state') return sendJson(res, 200, materialize(runId));
      return serveEvents(req, res, runId, url);
    }
    return sendJson(res, 404, { error: 'not found' });
  } catch (err) {
    if (!res.headersSent) sendJson(res, 500, { error: String(err && err.message) });
    else res.destroy();
  }
});

server.listen(PORT, '127.0.0.1', () => {
  console.log(`inspector mock on http://127.0.0.1:${PORT}/  (live tick ${LIVE_TICK_MS} ms${HUGE ? ', with run_demo_huge' : ''})`);
});
