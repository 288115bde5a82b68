// little inspector: lists runs and shows one run live (timeline, steps, tokens and cost).
// Plain browser JavaScript, no dependencies, no build step. Talks only to its own origin:
//   GET /api/runs, GET /api/runs/:id/state, GET /api/runs/:id/events (Server-Sent Events).
// Every piece of run data reaches the DOM through textContent or setAttribute, never innerHTML.
'use strict';

(() => {
  // ------------------------------------------------------------------ constants
  const KNOWN_TYPES = [
    'RunStarted', 'RunCompleted', 'RunFailed', 'StepStarted', 'StepCompleted', 'StepFailed',
    'ParallelGroupStarted', 'ParallelGroupCompleted', 'ParallelGroupFailed',
    'ParallelBranchScheduled', 'ParallelBranchCompleted', 'ParallelBranchFailed',
    'OuterLoopCycleCompleted',
    'harness.session.started', 'harness.session.completed', 'harness.session.failed',
    'harness.model.called', 'harness.model.responded',
    'harness.tool_call.started', 'harness.tool_call.succeeded', 'harness.tool_call.failed',
    'harness.execute_step.started', 'harness.execute_step.succeeded',
    'run:started', 'node:started', 'agent:token', 'agent:reasoning', 'agent:tool_call',
    'agent:tool_result', 'agent:approval_requested', 'agent:file_patch_proposed', 'cost:updated',
    'node:completed', 'node:failed', 'node:skipped', 'node:retrying', 'media_job:submitted',
    'human_gate:paused', 'human_gate:resumed', 'run:completed', 'run:failed', 'run:cancelled',
    'run:paused', 'run:timeout', 'budget:warning', 'budget:paused', 'budget:estimate_committed',
    'cost:attempt_settled', 'session:started', 'session:turn_started', 'session:turn_completed',
    'session:cancelled', 'session:exported', 'session:compacting', 'session:compacted',
    'session:trimmed',
  ];
  const KNOWN = new Set(KNOWN_TYPES);
  const MAX_ROWS = 2000; // timeline rows kept in the DOM
  const MAX_STEP_ROWS = 1000;
  const MAX_STEP_BARS = 40;
  const RUNS_POLL_MS = 3000;
  const STATE_MIN_INTERVAL_MS = 250; // /state is fetched at most this often
  const BEHIND_GRACE_MS = 1200; // how long events may be "in flight" before we call it a hole
  const FILL_IDLE_MS = 2500; // a gap fill gives up after this long without progress
  const FILL_DEADLINE_MS = 20000;
  const RUN_ID_RE = /^run_[A-Za-z0-9_-]{1,80}$/;

  // ------------------------------------------------------------------ small helpers
  const $ = (id) => document.getElementById(id);
  function el(tag, className, text) {
    const e = document.createElement(tag);
    if (className) e.className = className;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  const isObj = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);
  const num = (v) => (typeof v === 'number' && Number.isFinite(v) ? v : 0);
  const intFmt = new Intl.NumberFormat('en-US');
  const fmtInt = (n) => intFmt.format(Math.round(num(n)));
  function fmtShort(n) {
    n = num(n);
    if (n >= 1e9) return (n / 1e9).toFixed(n >= 1e10 ? 0 : 1) + 'B';
    if (n >= 1e6) return (n / 1e6).toFixed(n >= 1e7 ? 0 : 1) + 'M';
    if (n >= 1e4) return (n / 1e3).toFixed(n >= 1e5 ? 0 : 1) + 'k';
    return fmtInt(n);
  }
  function fmtUsd(n) {
    if (n === 0) return '$0.00';
    if (n >= 100) return '$' + n.toFixed(2);
    if (n >= 1) return '$' + n.toFixed(3);
    if (n >= 0.01) return '$' + n.toFixed(4);
    return '$' + n.toFixed(6);
  }
  /** A UsageTotals' cost as { text, note, unpriced }: null is UNPRICED, never "$0". */
  function costOf(u) {
    if (!isObj(u)) return { text: '—', note: '', unpriced: false };
    const unpricedCalls = num(u.unpricedCalls);
    const pricedCalls = num(u.pricedCalls);
    if (u.costUsd === null || u.costUsd === undefined || typeof u.costUsd !== 'number') {
      return {
        text: 'unpriced',
        note: unpricedCalls > 0 ? `${fmtInt(unpricedCalls)} unpriced call${unpricedCalls === 1 ? '' : 's'}` : '',
        unpriced: true,
      };
    }
    const note = pricedCalls > 0 && unpricedCalls > 0
      ? `+${fmtInt(unpricedCalls)} unpriced call${unpricedCalls === 1 ? '' : 's'}` : '';
    return { text: fmtUsd(u.costUsd), note, unpriced: false };
  }
  function runCostText(c) {
    if (c === null || c === undefined) return 'unpriced';
    return typeof c === 'number' ? fmtUsd(c) : '—';
  }
  const tokensOf = (u) => (isObj(u) ? num(u.inputTokens) + num(u.outputTokens) : 0);
  function parseTime(iso) {
    const t = typeof iso === 'string' ? Date.parse(iso) : NaN;
    return Number.isFinite(t) ? t : null;
  }
  const pad = (n, w = 2) => String(n).padStart(w, '0');
  function fmtClock(iso) {
    const t = parseTime(iso);
    if (t === null) return '—';
    const d = new Date(t);
    return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
  }
  function fmtDateTime(iso) {
    const t = parseTime(iso);
    if (t === null) return '—';
    const d = new Date(t);
    const today = new Date();
    const sameDay = d.toDateString() === today.toDateString();
    const time = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
    return sameDay ? time : `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${time}`;
  }
  function fmtDuration(ms) {
    if (!Number.isFinite(ms) || ms < 0) return '—';
    if (ms < 1000) return `${Math.round(ms)} ms`;
    const s = ms / 1000;
    if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m} m ${Math.floor(s % 60)} s`;
    const h = Math.floor(m / 60);
    return `${h} h ${m % 60} m`;
  }
  function fmtAgo(iso) {
    const t = parseTime(iso);
    if (t === null) return '—';
    const s = Math.max(0, (Date.now() - t) / 1000);
    if (s < 5) return 'just now';
    if (s < 60) return `${Math.floor(s)}s ago`;
    if (s < 3600) return `${Math.floor(s / 60)}m ago`;
    if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
    return fmtDateTime(iso);
  }
  function clip(s, n = 160) {
    s = String(s).replace(/\s+/g, ' ').trim();
    return s.length > n ? s.slice(0, n - 1) + '…' : s;
  }
  function preview(v, n = 80) {
    if (v === undefined) return '';
    if (typeof v === 'string') return JSON.stringify(clip(v, n));
    let s;
    try { s = JSON.stringify(v); } catch { s = String(v); }
    return clip(s === undefined ? String(v) : s, n);
  }
  function statusWord(s) {
    return ['pending', 'running', 'completed', 'failed'].includes(s) ? s : 'pending';
  }
  function setStatus(node, status) {
    const s = statusWord(status);
    node.dataset.status = s;
    node.textContent = s;
  }
  async function getJson(url, signal) {
    const res = await fetch(url, { signal, cache: 'no-store', headers: { Accept: 'application/json' } });
    let body = null;
    try { body = await res.json(); } catch { body = null; }
    if (!res.ok) {
      const err = new Error((isObj(body) && typeof body.error === 'string' && body.error) || `HTTP ${res.status}`);
      err.status = res.status;
      throw err;
    }
    return body;
  }
  const runUrl = (runId, what) => `/api/runs/${encodeURIComponent(runId)}/${what}`;

  // ------------------------------------------------------------------ event summaries
  function errMsg(e) {
    if (isObj(e)) return clip(String(e.message ?? e.code ?? preview(e)), 120);
    return e === undefined ? '' : clip(String(e), 120);
  }
  function usageText(u) {
    if (!isObj(u)) return '';
    let s = `in ${fmtInt(u.inputTokens)}`;
    if (num(u.cachedInputTokens)) s += ` (cached ${fmtInt(u.cachedInputTokens)})`;
    s += ` · out ${fmtInt(u.outputTokens)}`;
    if (num(u.reasoningTokens)) s += ` (reasoning ${fmtInt(u.reasoningTokens)})`;
    return s;
  }
  const micro = (m) => (typeof m === 'number' ? fmtUsd(m / 1e8) : '');

  /** One line about an envelope's payload; plain text, set with textContent by the caller. */
  function summarize(env) {
    const p = isObj(env.payload) ? env.payload : {};
    const t = String(env.type);
    const parts = [];
    const add = (v) => { if (v !== undefined && v !== null && v !== '') parts.push(String(v)); };
    switch (t) {
      case 'RunStarted':
        add(p.workflowVersionId);
        if (p.input !== undefined) add('input ' + preview(p.input, 90));
        break;
      case 'RunCompleted':
        if (p.outputRef) add('output → ' + p.outputRef); else if (p.output !== undefined) add('output ' + preview(p.output, 110));
        break;
      case 'StepStarted':
        add(p.stepPath); add(p.stepKind); if (p.attempt) add(`attempt ${p.attempt}`);
        break;
      case 'StepCompleted':
        add(p.stepPath);
        if (p.outputRef) add('output → ' + p.outputRef); else if (p.output !== undefined) add('output ' + preview(p.output, 90));
        break;
      case 'ParallelGroupStarted': case 'ParallelGroupCompleted':
        add(p.stepPath); add(p.groupId); if (p.branchCount !== undefined) add(`${p.branchCount} branches`);
        break;
      case 'ParallelBranchScheduled': case 'ParallelBranchCompleted':
        add(p.stepPath); if (p.branch !== undefined) add(`branch ${p.branch}`);
        break;
      case 'OuterLoopCycleCompleted':
        add(p.outerLoopId); add(`cycle ${p.cycleNumber}`); add(isObj(p.supervise) ? p.supervise.kind : '');
        break;
      case 'harness.session.started':
        add(p.role); add(isObj(p.task) ? p.task.kind : ''); add(p.runId);
        break;
      case 'harness.session.completed':
        add(p.runId); add(usageText(p.usage));
        break;
      case 'harness.model.called': {
        const r = isObj(p.request) ? p.request : {};
        add(`turn ${p.turn}`); add(r.model);
        if (Array.isArray(r.messages)) add(`${r.messages.length} messages`);
        if (Array.isArray(r.tools) && r.tools.length) add(`${r.tools.length} tools`);
        break;
      }
      case 'harness.model.responded': {
        const m = isObj(p.model) ? `${p.model.provider}/${p.model.modelId}` : '';
        const r = isObj(p.response) ? p.response : {};
        add(m); add(p.stepPath); add(usageText(r.usage));
        if (typeof r.text === 'string') add(preview(r.text, 60));
        break;
      }
      case 'harness.tool_call.started':
        add(p.toolName); add(p.callId);
        if (p.argsRef) add('args → ' + p.argsRef); else if (p.args !== undefined) add(preview(p.args, 80));
        break;
      case 'harness.tool_call.succeeded':
        add(p.callId); if (p.durationMs !== undefined) add(`${p.durationMs} ms`);
        if (p.resultRef) add('result → ' + p.resultRef); else if (p.result !== undefined) add(preview(p.result, 80));
        break;
      case 'harness.execute_step.started':
        add(p.stepPath); add(p.stepKind);
        break;
      case 'harness.execute_step.succeeded':
        add(p.stepPath); if (p.durationMs !== undefined) add(`${p.durationMs} ms`);
        break;
      case 'agent:token': case 'agent:reasoning':
        add(p.nodeId); add(p.model); add(preview(p.token ?? p.delta ?? p.text, 60));
        break;
      case 'cost:updated':
        add(p.nodeId); add(p.model);
        if (p.inputTokens !== undefined) add(`in ${fmtInt(p.inputTokens)} · out ${fmtInt(p.outputTokens)}`);
        add(micro(p.costMicrocents)); if (p.cumulativeCostMicrocents !== undefined) add(`total ${micro(p.cumulativeCostMicrocents)}`);
        break;
      default:
        break;
    }
    if (parts.length === 0) return genericSummary(p);
    if (p.error !== undefined) parts.push('error: ' + errMsg(p.error));
    return clip(parts.join(' · '), 220);
  }
  const PREFERRED_KEYS = ['stepPath', 'nodeId', 'runId', 'sessionId', 'toolId', 'toolName', 'model', 'gateId',
    'decision', 'reason', 'attemptNumber', 'message'];
  function genericSummary(p) {
    const keys = Object.keys(p);
    if (keys.length === 0) return '';
    const ordered = PREFERRED_KEYS.filter((k) => k in p).concat(keys.filter((k) => !PREFERRED_KEYS.includes(k)));
    const parts = [];
    if (p.error !== undefined) parts.push('error: ' + errMsg(p.error));
    for (const k of ordered) {
      if (k === 'error') continue;
      const v = p[k];
      let s;
      if (v === null || typeof v !== 'object') s = typeof v === 'string' ? clip(v, 60) : String(v);
      else if (Array.isArray(v)) s = `[${v.length}]`;
      else s = clip(JSON.stringify(v), 50);
      parts.push(`${k}=${s}`);
      if (parts.join(' ').length > 200) break;
    }
    return clip(parts.join(' · '), 220);
  }
  function typeCategory(t) {
    if (!KNOWN.has(t)) return 'custom';
    if (/fail|Failed|:failed|timeout|cancelled/.test(t)) return 'bad';
    if (/^Run|^run:/.test(t)) return 'run';
    if (/^Parallel/.test(t)) return 'parallel';
    if (/^Step|^node:|execute_step/.test(t)) return 'step';
    if (/model|agent:token|agent:reasoning/.test(t)) return 'model';
    if (/tool|approval|file_patch/.test(t)) return 'tool';
    if (/^cost:|^budget:/.test(t)) return 'cost';
    if (/session/.test(t)) return 'session';
    return 'other';
  }

  // ------------------------------------------------------------------ SSE parsing for gap fills
  /**
   * Read `/events?after=N` with fetch and parse the SSE frames ourselves. EventSource only
   * dispatches event names it has listeners for, so an event of a type nobody predicted (a user's
   * `my.custom.fact`) can only be fetched this way. Calls onEvent(type, data) per frame until
   * shouldStop() or the stream ends or stalls.
   */
  async function readSse(url, onEvent, shouldStop, signal) {
    const res = await fetch(url, { signal, cache: 'no-store', headers: { Accept: 'text/event-stream' } });
    if (!res.ok || !res.body) {
      const err = new Error(`HTTP ${res.status}`);
      err.status = res.status;
      throw err;
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = '';
    let type = '';
    let data = [];
    try {
      for (;;) {
        if (shouldStop()) return;
        const { value, done } = await reader.read();
        if (done) return;
        buf += decoder.decode(value, { stream: true });
        let i;
        while ((i = buf.search(/\r\n|\r|\n/)) >= 0) {
          if (buf[i] === '\r' && i === buf.length - 1) break; // maybe a split \r\n: wait for more
          const line = buf.slice(0, i);
          buf = buf.slice(i + (buf.startsWith('\r\n', i) ? 2 : 1));
          if (line === '') {
            if (data.length) onEvent(type || 'message', data.join('\n'));
            type = '';
            data = [];
            if (shouldStop()) return;
            continue;
          }
          if (line[0] === ':') continue;
          const c = line.indexOf(':');
          const field = c < 0 ? line : line.slice(0, c);
          let v = c < 0 ? '' : line.slice(c + 1);
          if (v[0] === ' ') v = v.slice(1);
          if (field === 'event') type = v;
          else if (field === 'data') data.push(v);
        }
      }
    } finally {
      try { await reader.cancel(); } catch { /* already closed */ }
    }
  }

  // ------------------------------------------------------------------ the selected run
  function setLive(state) {
    const n = $('live-indicator');
    n.textContent = state === 'live' ? 'live' : 'reconnecting';
    n.dataset.state = state;
  }

  class RunView {
    constructor(runId) {
      this.runId = runId;
      this.alive = true;
      // Which sequences we hold: every s <= lastContig, plus `above` (held, past a hole).
      this.lastContig = 0;
      this.above = new Set();
      this.maxSeq = 0;
      this.types = new Set(KNOWN_TYPES);
      // Rendering
      this.rows = new Map(); // seq -> { env, li } for rows in the DOM
      this.pending = []; // envelopes waiting for the next render flush
      this.flushTimer = 0;
      // Stream
      this.es = null;
      this.esOpenedAt = 0;
      this.backoff = 500;
      this.reconnectTimer = 0;
      // An event of type `error` arrives as a MessageEvent named "error", as the EventSource's own
      // errors do (plain Events, with no data): each goes to its own handler.
      this.onMessage = (e) => { if (e instanceof MessageEvent) this.onSse(e); };
      // State
      this.state = null;
      this.stateCtrl = null;
      this.stateTimer = 0;
      this.stateInFlight = false;
      this.stateDirty = false;
      this.lastStateAt = 0;
      this.stateReq = 0;
      this.stateDrawn = 0;
      this.stateInterval = STATE_MIN_INTERVAL_MS;
      // Resync
      this.resyncing = false;
      this.resyncQueued = false;
      this.resyncTimer = 0;
      this.behindTimer = 0;
      this.stuck = null; // { at: lastContig, until: time } after a resync that made no progress
      this.fillCtrl = null;
      this.stats = { resyncs: 0, fills: 0, duplicates: 0, gaps: 0, reopens: 0 };
      this.tick = setInterval(() => this.renderClock(), 1000);
    }

    /**
     * Load the state, then the backlog (read with fetch, so events of any type arrive in order),
     * then open the EventSource for live events with ?after=<last held sequence>.
     */
    async start() {
      clearTimeline();
      setLive('reconnecting');
      const st = await this.refreshState();
      if (st === false || !this.alive) return;
      const count = st ? num(st.eventCount) : 0;
      // The timeline keeps the last MAX_ROWS rows, and the steps and costs come from /state: the
      // events before those are not read (a run of 200,000 took 20 s and 150 MB to show).
      if (count > MAX_ROWS) this.lastContig = this.maxSeq = count - MAX_ROWS;
      if (count > 0) await this.fill(count);
      if (this.alive) this.openStream(this.lastContig);
    }

    destroy() {
      this.alive = false;
      this.closeStream();
      for (const t of [this.flushTimer, this.reconnectTimer, this.stateTimer, this.resyncTimer, this.behindTimer]) clearTimeout(t);
      clearInterval(this.tick);
      if (this.stateCtrl) this.stateCtrl.abort();
      if (this.fillCtrl) this.fillCtrl.abort();
    }

    get held() { return this.lastContig + this.above.size; }

    // ---- stream
    openStream(after) {
      this.closeStream();
      if (!this.alive) return;
      this.stats.reopens += 1;
      const es = new EventSource(`${runUrl(this.runId, 'events')}?after=${after}`);
      this.es = es;
      for (const t of this.types) es.addEventListener(t, this.onMessage);
      es.addEventListener('message', this.onMessage); // a server that sends unnamed events
      es.onopen = () => {
        if (this.es !== es) return;
        this.esOpenedAt = Date.now();
        setLive('live');
      };
      es.onerror = (e) => {
        if (this.es !== es || e instanceof MessageEvent) return;
        // We reconnect ourselves (with backoff, a /state resync, and ?after= the last contiguous
        // sequence) rather than letting EventSource retry from its own Last-Event-ID.
        this.closeStream();
        setLive('reconnecting');
        if (Date.now() - this.esOpenedAt > 10000) this.backoff = 500;
        const delay = this.backoff;
        this.backoff = Math.min(this.backoff * 2, 30000);
        clearTimeout(this.reconnectTimer);
        this.reconnectTimer = setTimeout(() => this.resync('reconnect'), delay);
      };
    }

    closeStream() {
      if (this.es) {
        this.es.onopen = null;
        this.es.onerror = null;
        this.es.close();
        this.es = null;
      }
    }

    learnType(t) {
      if (this.types.has(t)) return;
      this.types.add(t);
      if (this.es) this.es.addEventListener(t, this.onMessage);
    }

    onSse(e) {
      if (!this.alive) return;
      let env;
      try { env = JSON.parse(e.data); } catch { this.scheduleResync('bad-json'); return; }
      this.receive(env);
    }

    // ---- intake
    receive(env) {
      if (!isObj(env)) return false;
      const seq = env.sequence;
      if (!Number.isSafeInteger(seq) || seq < 1) return false;
      if (typeof env.runId === 'string' && env.runId !== this.runId) return false;
      if (seq <= this.lastContig || this.above.has(seq)) { this.stats.duplicates += 1; return false; }
      if (typeof env.type === 'string') this.learnType(env.type);
      if (seq === this.lastContig + 1) {
        this.lastContig = seq;
        while (this.above.delete(this.lastContig + 1)) this.lastContig += 1;
      } else {
        this.above.add(seq);
      }
      if (seq > this.maxSeq) this.maxSeq = seq;
      this.pending.push(env);
      if (this.pending.length > MAX_ROWS * 2) {
        this.pending.sort((a, b) => a.sequence - b.sequence);
        this.pending = this.pending.slice(-MAX_ROWS);
      }
      if (!this.flushTimer) this.flushTimer = setTimeout(() => this.flush(), 40);
      this.scheduleState();
      if (this.above.size > 0) {
        this.stats.gaps += 1;
        this.scheduleResync('gap');
      }
      return true;
    }

    // ---- rendering the timeline (bounded)
    flush() {
      this.flushTimer = 0;
      if (!this.alive) return;
      const list = $('timeline');
      const batch = this.pending.sort((a, b) => a.sequence - b.sequence);
      this.pending = [];
      if (batch.length) for (const n of list.querySelectorAll(':scope > .timeline-empty')) n.remove();
      const seqOf = (n) => (n ? Number(n.dataset.seq) : 0);
      const frag = document.createDocumentFragment();
      let fragMax = seqOf(list.lastElementChild);
      for (const env of batch) {
        const seq = env.sequence;
        if (this.rows.size >= MAX_ROWS && seq < seqOf(list.firstElementChild)) continue; // outside the window
        const li = eventRow(env);
        this.rows.set(seq, { env, li });
        if (seq > fragMax) { frag.append(li); fragMax = seq; continue; }
        // Out of order (a late event): place what we have, then insert before the next larger row.
        list.append(frag);
        let next = null;
        for (let n = list.lastElementChild; n && seqOf(n) > seq; n = n.previousElementSibling) next = n;
        list.insertBefore(li, next);
      }
      list.append(frag);
      while (this.rows.size > MAX_ROWS && list.firstElementChild) {
        const first = list.firstElementChild;
        this.rows.delete(seqOf(first));
        first.remove();
      }
      list.dataset.count = String(this.held);
      list.dataset.lastSeq = String(this.lastContig);
      const note = $('timeline-note');
      if (this.held > this.rows.size) {
        note.hidden = false;
        note.textContent = `Showing the last ${fmtInt(this.rows.size)} of ${fmtInt(this.held)} events.`;
      } else {
        note.hidden = true;
      }
      if ($('follow').checked && batch.length) {
        this.autoScrolling = true;
        list.scrollTop = list.scrollHeight;
      }
      $('run-events').textContent = fmtInt(Math.max(this.held, this.state ? num(this.state.eventCount) : 0));
    }

    expand(li) {
      const seq = Number(li.dataset.seq);
      const row = this.rows.get(seq);
      const head = li.querySelector('.ev-head');
      let pre = li.querySelector('.ev-json');
      if (pre) {
        pre.remove();
        head.setAttribute('aria-expanded', 'false');
        li.classList.remove('open');
        return;
      }
      pre = el('pre', 'ev-json');
      pre.textContent = row ? JSON.stringify(row.env, null, 2) : '(no longer held)';
      li.append(pre);
      li.classList.add('open');
      head.setAttribute('aria-expanded', 'true');
    }

    // ---- state
    scheduleState() {
      if (this.stateTimer || !this.alive) return;
      const wait = Math.max(0, this.lastStateAt + this.stateInterval - Date.now());
      this.stateTimer = setTimeout(() => {
        this.stateTimer = 0;
        if (this.stateInFlight) { this.stateDirty = true; return; }
        this.refreshState();
      }, wait);
    }

    /** Fetch /state and draw it. Resolves to the state, null on a transient error, false on 400. */
    async refreshState() {
      if (!this.alive) return null;
      this.stateInFlight = true;
      const t0 = Date.now();
      this.lastStateAt = t0;
      const req = ++this.stateReq;
      const ctrl = new AbortController();
      this.stateCtrl = ctrl;
      try {
        const st = await getJson(runUrl(this.runId, 'state'), ctrl.signal);
        if (!this.alive) return null;
        if (!isObj(st)) throw new Error('state is not an object');
        // A slow server (a huge run) is asked less often: at most a fifth of its time on /state.
        this.stateInterval = Math.min(5000, Math.max(STATE_MIN_INTERVAL_MS, 4 * (Date.now() - t0)));
        if (req > this.stateDrawn) { // never draw an older answer over a newer one
          this.stateDrawn = req;
          this.state = st;
          renderState(this, st);
        }
        this.noteCount(num(st.eventCount));
        return st;
      } catch (err) {
        if (!this.alive || err.name === 'AbortError') return null;
        if (err.status === 400) {
          showRunError(`The server refused this run id (400): ${err.message}`);
          this.alive = false;
          this.closeStream();
          setLive('reconnecting');
          return false;
        }
        showRunError(`Could not load state: ${err.message}`, true);
        return null;
      } finally {
        this.stateInFlight = false;
        if (this.stateDirty && this.alive) { this.stateDirty = false; this.scheduleState(); }
      }
    }

    /** The server says `count` events exist (from /state or /api/runs). Catch up if we lag. */
    noteCount(count) {
      if (!(count > this.lastContig) || this.behindTimer || this.isStuck()) return;
      const target = count;
      this.behindTimer = setTimeout(() => {
        this.behindTimer = 0;
        if (this.alive && this.lastContig < target) this.resync('behind');
      }, BEHIND_GRACE_MS);
    }

    // ---- gap resync
    isStuck() {
      return !!this.stuck && this.stuck.at === this.lastContig && Date.now() < this.stuck.until;
    }

    scheduleResync(reason) {
      if (this.resyncTimer || !this.alive || this.isStuck()) return;
      this.resyncTimer = setTimeout(() => { this.resyncTimer = 0; this.resync(reason); }, 150);
    }

    /**
     * Resync: fetch /state, fetch every event we lack after the last contiguous sequence (by
     * reading the SSE stream with fetch, which also sees types EventSource has no listener for),
     * then close and reopen the EventSource with ?after=<last contiguous sequence>.
     */
    async resync(reason) {
      if (!this.alive) return;
      if (this.resyncing) { this.resyncQueued = true; return; }
      this.resyncing = true;
      this.stats.resyncs += 1;
      this.lastResyncReason = String(reason);
      try {
        do {
          this.resyncQueued = false;
          const before = this.lastContig;
          const st = await this.refreshState();
          if (st === false || !this.alive) return;
          const target = Math.max(st ? num(st.eventCount) : 0, this.maxSeq);
          if (this.lastContig < target) await this.fill(target);
          if (!this.alive) return;
          if (this.lastContig < target && this.lastContig === before) {
            // No progress: those sequences cannot be had right now. Do not spin on the hole.
            this.stuck = { at: this.lastContig, until: Date.now() + 10000 };
            showRunError(`Events after #${this.lastContig} could not be loaded yet; retrying.`, true);
          } else {
            this.stuck = null;
            if (st) hideRunError(true);
          }
          if (reason === 'reconnect' || !this.es || this.lastContig < target || this.above.size > 0 || reason === 'gap') {
            this.openStream(this.lastContig);
          }
        } while (this.resyncQueued && this.alive);
      } finally {
        this.resyncing = false;
      }
    }

    async fill(target) {
      if (this.fillCtrl) this.fillCtrl.abort();
      const ctrl = new AbortController();
      this.fillCtrl = ctrl;
      this.stats.fills += 1;
      const started = Date.now();
      let lastProgress = Date.now();
      let last = this.lastContig;
      const watchdog = setInterval(() => {
        if (this.lastContig !== last) { last = this.lastContig; lastProgress = Date.now(); }
        if (Date.now() - lastProgress > FILL_IDLE_MS || Date.now() - started > FILL_DEADLINE_MS) ctrl.abort();
      }, 250);
      try {
        await readSse(
          `${runUrl(this.runId, 'events')}?after=${this.lastContig}`,
          (type, data) => {
            if (type && type !== 'message') this.learnType(type);
            let env;
            try { env = JSON.parse(data); } catch { return; }
            this.receive(env);
          },
          () => !this.alive || this.lastContig >= target,
          ctrl.signal,
        );
      } catch (err) {
        if (err.name !== 'AbortError') console.warn('inspector: gap fill failed', err);
      } finally {
        clearInterval(watchdog);
        ctrl.abort();
        if (this.fillCtrl === ctrl) this.fillCtrl = null;
      }
    }

    renderClock() {
      if (!this.state || !this.alive) return;
      const st = this.state;
      if (st.status === 'running' && st.startedAt && !st.finishedAt) {
        const t = parseTime(st.startedAt);
        if (t !== null) $('run-duration').textContent = fmtDuration(Date.now() - t);
      }
    }
  }

  // ------------------------------------------------------------------ rendering: timeline rows
  function eventRow(env) {
    const type = String(env.type ?? '');
    const li = el('li', 'ev');
    li.dataset.seq = String(env.sequence);
    li.dataset.type = type;
    li.dataset.cat = typeCategory(type);
    const head = el('button', 'ev-head');
    head.type = 'button';
    head.setAttribute('aria-expanded', 'false');
    head.append(
      el('span', 'ev-seq', `#${env.sequence}`),
      el('span', 'ev-time', fmtClock(env.recordedAt)),
      el('span', 'ev-type', type),
      el('span', 'ev-sum', summarize(env)),
    );
    if (typeof env.recordedAt === 'string') head.title = env.recordedAt;
    li.append(head);
    return li;
  }
  function clearTimeline() {
    const list = $('timeline');
    list.replaceChildren();
    list.dataset.count = '0';
    list.dataset.lastSeq = '0';
    $('timeline-note').hidden = true;
  }

  // ------------------------------------------------------------------ rendering: run state
  /** kind: 'soft' (a transient note), 'failed' (the run's own error), 'hard' (cannot show the run). */
  function showRunError(msg, soft) {
    const n = $('run-error');
    n.hidden = false;
    n.textContent = msg;
    n.dataset.kind = soft === true ? 'soft' : soft || 'hard';
  }
  function hideRunError(onlySoft) {
    const n = $('run-error');
    if (onlySoft && n.dataset.kind === 'hard') return;
    n.hidden = true;
    n.textContent = '';
    n.dataset.kind = '';
  }

  function renderState(view, st) {
    hideRunError(true);
    setStatus($('run-status'), st.status);
    $('run-started').textContent = fmtDateTime(st.startedAt);
    $('run-finished').textContent = st.finishedAt ? fmtDateTime(st.finishedAt) : (st.status === 'running' ? 'running…' : '—');
    const a = parseTime(st.startedAt);
    const b = parseTime(st.finishedAt);
    $('run-duration').textContent = a !== null ? fmtDuration((b ?? Date.now()) - a) : '—';
    $('run-events').textContent = fmtInt(Math.max(num(st.eventCount), view.held));
    $('run-workflow').textContent = typeof st.workflowVersionId === 'string' ? st.workflowVersionId : '—';
    const u = isObj(st.usage) ? st.usage : {};
    $('total-input').textContent = fmtInt(u.inputTokens);
    $('total-cached').textContent = fmtInt(u.cachedInputTokens);
    $('total-output').textContent = fmtInt(u.outputTokens);
    $('total-reasoning').textContent = fmtInt(u.reasoningTokens);
    const c = costOf(u);
    const noCalls = num(u.pricedCalls) + num(u.unpricedCalls) === 0;
    const totalCost = $('total-cost');
    totalCost.textContent = noCalls && u.costUsd !== null ? fmtUsd(num(u.costUsd)) : c.text;
    totalCost.classList.toggle('unpriced', c.unpriced);
    $('total-cost-note').textContent = c.note ? ' ' + c.note : '';
    if (noCalls) $('total-cost-note').textContent = ' no model calls';

    const extra = [];
    if (st.pricingAsOf) extra.push(`prices as of ${st.pricingAsOf}`);
    if (Array.isArray(st.artifacts) && st.artifacts.length) extra.push(`${st.artifacts.length} artifact${st.artifacts.length === 1 ? '' : 's'}`);
    if (Array.isArray(st.sessions) && st.sessions.length) {
      extra.push('sessions: ' + st.sessions.slice(0, 6).map((s) => `${s.role} (${s.status})`).join(', ') + (st.sessions.length > 6 ? ', …' : ''));
    }
    if (Array.isArray(st.manifestDrift) && st.manifestDrift.length) extra.push(`⚠ manifest drift ×${st.manifestDrift.length}`);
    if (isObj(st.outerLoop)) extra.push(`outer loop ${st.outerLoop.outerLoopId} cycle ${st.outerLoop.cycleNumber} (${st.outerLoop.lastKind})`);
    if (st.outputRef) extra.push(`output → ${st.outputRef}`);
    else if (st.output !== undefined) extra.push(`output ${preview(st.output, 120)}`);
    $('run-extra').textContent = extra.join(' · ');
    if (st.status === 'failed') showRunError('Run failed: ' + (st.error !== undefined ? errMsg(st.error) : 'no error recorded'), 'failed');

    if (num(st.eventCount) === 0 && view.held === 0) {
      const list = $('timeline');
      if (!list.firstElementChild) {
        list.append(el('li', 'timeline-empty', st.status === 'pending'
          ? 'No events yet: the run is pending. New events appear here as they are recorded.'
          : 'No events.'));
      }
    }
    renderSteps(st);
    renderBars(st);
  }

  function stepOrder(a, b) {
    const ta = parseTime(a.startedAt);
    const tb = parseTime(b.startedAt);
    if (ta !== tb) {
      if (ta === null) return 1;
      if (tb === null) return -1;
      return ta - tb;
    }
    return a.stepPath < b.stepPath ? -1 : a.stepPath > b.stepPath ? 1 : 0;
  }
  const STATUS_ICON = { pending: '○', running: '◐', completed: '✓', failed: '✗' };

  function renderSteps(st) {
    const list = $('steps');
    const steps = isObj(st.steps)
      ? Object.entries(st.steps).map(([k, s]) => (isObj(s) ? { ...s, stepPath: String(s.stepPath ?? k) } : null)).filter(Boolean)
      : [];
    steps.sort(stepOrder);
    const shown = steps.length > MAX_STEP_ROWS ? steps.slice(-MAX_STEP_ROWS) : steps;
    const counts = { pending: 0, running: 0, completed: 0, failed: 0 };
    for (const s of steps) counts[statusWord(s.status)] += 1;
    $('steps-count').textContent = steps.length
      ? `${steps.length} · ${counts.completed} done · ${counts.running} running · ${counts.failed} failed`
        + (shown.length < steps.length ? ` · showing last ${shown.length}` : '')
      : '';
    // Indent a step under its nearest ancestor that is itself a step, and name it relative to it.
    const paths = new Set(steps.map((s) => s.stepPath));
    const depthOf = new Map();
    const nest = (path) => {
      if (depthOf.has(path)) return depthOf.get(path);
      let r = { depth: 0, label: path };
      for (let i = path.lastIndexOf('/'); i > 0; i = path.lastIndexOf('/', i - 1)) {
        const parent = path.slice(0, i);
        if (paths.has(parent)) { r = { depth: nest(parent).depth + 1, label: path.slice(i + 1) }; break; }
      }
      depthOf.set(path, r);
      return r;
    };
    const existing = new Map();
    for (const li of list.children) if (li.dataset.stepPath !== undefined) existing.set(li.dataset.stepPath, li);
    const frag = [];
    for (const s of shown) {
      let li = existing.get(s.stepPath);
      existing.delete(s.stepPath);
      if (!li) li = stepRow(s.stepPath);
      updateStepRow(li, s, nest(s.stepPath));
      frag.push(li);
    }
    for (const li of existing.values()) li.remove();
    if (steps.length === 0) {
      list.replaceChildren(el('li', 'empty', 'No steps yet.'));
      return;
    }
    // Re-order only when needed, to keep the DOM quiet on every refresh.
    let same = list.children.length === frag.length;
    if (same) for (let i = 0; i < frag.length; i++) if (list.children[i] !== frag[i]) { same = false; break; }
    if (!same) list.replaceChildren(...frag);
    if (st.status === 'running' && stepsPinned) list.scrollTop = list.scrollHeight; // follow the newest steps
  }
  let stepsPinned = true;
  function stepRow(path) {
    const li = el('li', 'step');
    li.dataset.stepPath = path;
    const icon = el('span', 'step-icon');
    icon.setAttribute('aria-hidden', 'true');
    const name = el('span', 'step-name');
    name.append(el('span', 'step-path'), el('span', 'step-kind'));
    const extra = el('span', 'step-extra');
    extra.append(el('span', 'step-error'), el('span', 'step-note'));
    li.append(icon, name, el('span', 'step-status'), el('span', 'step-attempts'),
      el('span', 'step-dur'), el('span', 'step-tokens'), el('span', 'step-cost'), extra);
    return li;
  }
  function updateStepRow(li, s, nest) {
    const status = statusWord(s.status);
    li.dataset.status = status;
    const q = (c) => li.querySelector('.' + c);
    li.style.setProperty('--depth', String(Math.min(nest.depth, 8)));
    q('step-path').textContent = nest.label;
    q('step-icon').textContent = STATUS_ICON[status];
    q('step-status').textContent = status;
    q('step-kind').textContent = s.stepKind ? String(s.stepKind) : '';
    const attempts = num(s.attempts);
    q('step-attempts').textContent = attempts > 1 ? `${attempts} attempts` : attempts === 1 ? '1 attempt' : '';
    q('step-attempts').classList.toggle('retried', attempts > 1);
    const a = parseTime(s.startedAt);
    const b = parseTime(s.finishedAt);
    q('step-dur').textContent = a !== null && b !== null ? fmtDuration(b - a) : '';
    const u = isObj(s.usage) ? s.usage : null;
    const calls = u ? num(u.pricedCalls) + num(u.unpricedCalls) : 0;
    q('step-tokens').textContent = calls ? `${fmtShort(tokensOf(u))} tok` : '';
    const c = costOf(u);
    q('step-cost').textContent = calls ? c.text : '';
    q('step-note').textContent = calls && c.note ? c.note : '';
    q('step-cost').classList.toggle('unpriced', calls > 0 && c.unpriced);
    q('step-error').textContent = status === 'failed' && s.error !== undefined ? errMsg(s.error) : '';
    q('step-extra').hidden = !q('step-error').textContent && !q('step-note').textContent;
    li.title = `${s.stepPath}\nstatus: ${status}` + (s.groupId ? `\ngroup: ${s.groupId}` : '')
      + (s.startedAt ? `\nstarted: ${s.startedAt}` : '') + (s.finishedAt ? `\nfinished: ${s.finishedAt}` : '');
  }

  // ------------------------------------------------------------------ rendering: bars
  function renderBars(st) {
    const models = isObj(st.usageByModel) ? Object.entries(st.usageByModel).filter(([, u]) => isObj(u)) : [];
    drawBars($('bars-models'), models, 'No model calls yet.');
    const steps = isObj(st.steps)
      ? Object.entries(st.steps)
        .filter(([, s]) => isObj(s) && isObj(s.usage) && num(s.usage.pricedCalls) + num(s.usage.unpricedCalls) + tokensOf(s.usage) > 0)
        .map(([k, s]) => [String(s.stepPath ?? k), s.usage])
      : [];
    drawBars($('bars-steps'), steps, 'No model calls attributed to a step yet.', MAX_STEP_BARS);
  }

  function drawBars(container, entries, emptyText, limit = Infinity) {
    entries.sort((a, b) => tokensOf(b[1]) - tokensOf(a[1]) || (a[0] < b[0] ? -1 : 1));
    const hidden = entries.length > limit ? entries.length - limit : 0;
    const shown = hidden ? entries.slice(0, limit) : entries;
    if (shown.length === 0) {
      container.replaceChildren(el('p', 'empty', emptyText));
      return;
    }
    const maxTok = Math.max(1, ...shown.map(([, u]) => tokensOf(u)));
    const maxCost = Math.max(0, ...shown.map(([, u]) => (typeof u.costUsd === 'number' ? u.costUsd : 0)));
    const existing = new Map();
    for (const n of container.querySelectorAll(':scope > .bar')) existing.set(n.dataset.key, n);
    const out = [];
    for (const [key, u] of shown) {
      let row = existing.get(key);
      existing.delete(key);
      if (!row) row = barRow(key);
      updateBar(row, u, maxTok, maxCost);
      out.push(row);
    }
    if (hidden) out.push(el('p', 'more muted small', `+${hidden} more (smaller) not drawn`));
    container.replaceChildren(...out);
  }

  function barRow(key) {
    const row = el('div', 'bar');
    row.dataset.key = key;
    const label = el('span', 'bar-label', key);
    label.title = key;
    const tok = el('span', 'track track-tokens');
    tok.setAttribute('role', 'img');
    for (const c of ['seg-input', 'seg-cached', 'seg-output', 'seg-reasoning']) tok.append(el('span', 'seg ' + c));
    const cost = el('span', 'track track-cost');
    cost.setAttribute('role', 'img');
    cost.append(el('span', 'seg seg-cost'));
    row.append(label, tok, el('span', 'bar-num bar-tokens'), cost, el('span', 'bar-num bar-cost'));
    return row;
  }

  function updateBar(row, u, maxTok, maxCost) {
    const input = num(u.inputTokens);
    const cached = Math.min(num(u.cachedInputTokens), input);
    const output = num(u.outputTokens);
    const reasoning = Math.min(num(u.reasoningTokens), output);
    const pct = (n) => `${((n / maxTok) * 100).toFixed(3)}%`;
    const segs = row.querySelectorAll('.track-tokens .seg');
    segs[0].style.width = pct(input - cached);
    segs[1].style.width = pct(cached);
    segs[2].style.width = pct(output - reasoning);
    segs[3].style.width = pct(reasoning);
    const total = input + output;
    const tokTrack = row.querySelector('.track-tokens');
    const detail = `input ${fmtInt(input)} (cached ${fmtInt(cached)}), output ${fmtInt(output)} (reasoning ${fmtInt(reasoning)})`;
    tokTrack.setAttribute('aria-label', `${fmtInt(total)} tokens: ${detail}`);
    row.querySelector('.bar-tokens').textContent = `${fmtShort(total)} tok`;
    const c = costOf(u);
    const costTrack = row.querySelector('.track-cost');
    const costSeg = row.querySelector('.seg-cost');
    costTrack.classList.toggle('unpriced', c.unpriced);
    costSeg.style.width = !c.unpriced && maxCost > 0 ? `${((u.costUsd / maxCost) * 100).toFixed(3)}%` : '0%';
    costTrack.setAttribute('aria-label', `cost ${c.text}${c.note ? ', ' + c.note : ''}`);
    const costNum = row.querySelector('.bar-cost');
    costNum.replaceChildren(el('span', c.unpriced ? 'unpriced' : '', c.text));
    if (c.note && !c.unpriced) costNum.append(el('span', 'note', c.note));
    costNum.classList.toggle('unpriced', c.unpriced);
    row.title = `${row.dataset.key}\n${fmtInt(total)} tokens: ${detail}\ncost: ${c.text}${c.note ? ' ' + c.note : ''}`
      + `\ncalls: ${fmtInt(u.pricedCalls)} priced, ${fmtInt(u.unpricedCalls)} unpriced`;
  }

  // ------------------------------------------------------------------ runs list
  const runsState = { list: [], error: null };
  let current = null; // RunView

  async function pollRuns() {
    try {
      // A request that never comes back must not end the polling: given up on after a minute.
      const list = await getJson('/api/runs', AbortSignal.timeout(60_000));
      runsState.list = Array.isArray(list) ? list.filter((r) => isObj(r) && typeof r.runId === 'string') : [];
      runsState.error = null;
    } catch (err) {
      runsState.error = err.message;
    }
    renderRuns();
    if (current && current.alive) {
      const r = runsState.list.find((x) => x.runId === current.runId);
      if (r) current.noteCount(num(r.lastSequence ?? r.eventCount));
    }
  }

  function renderRuns() {
    const ul = $('runs');
    const filter = $('runs-filter').value.trim().toLowerCase();
    $('runs-status').textContent = runsState.error ? `server unreachable (${runsState.error})` : `${runsState.list.length} runs`;
    $('runs-status').classList.toggle('error', !!runsState.error);
    const shown = filter ? runsState.list.filter((r) => r.runId.toLowerCase().includes(filter)) : runsState.list;
    $('runs-empty').hidden = runsState.list.length > 0 || !!runsState.error;
    const existing = new Map();
    for (const li of ul.children) existing.set(li.dataset.runId, li);
    const out = [];
    for (const r of shown) {
      let li = existing.get(r.runId);
      if (!li) li = runRow(r.runId);
      updateRunRow(li, r);
      out.push(li);
    }
    let same = ul.children.length === out.length;
    if (same) for (let i = 0; i < out.length; i++) if (ul.children[i] !== out[i]) { same = false; break; }
    if (!same) ul.replaceChildren(...out);
  }

  function runRow(runId) {
    const li = el('li', 'run-row');
    li.dataset.runId = runId;
    const a = el('a', 'run-link');
    a.href = '#' + encodeURIComponent(runId);
    const top = el('span', 'run-top');
    top.append(el('span', 'status'), el('span', 'run-id', runId));
    const meta = el('span', 'run-meta');
    meta.append(el('span', 'run-count'), el('span', 'run-time'), el('span', 'run-cost'));
    a.append(top, meta);
    li.append(a);
    return li;
  }

  function updateRunRow(li, r) {
    setStatus(li.querySelector('.status'), r.status);
    li.dataset.status = statusWord(r.status);
    li.querySelector('.run-count').textContent = `${fmtInt(r.eventCount)} events`;
    const time = li.querySelector('.run-time');
    time.textContent = fmtAgo(r.lastRecordedAt);
    time.title = typeof r.lastRecordedAt === 'string' ? `last event ${r.lastRecordedAt}` : '';
    const cost = li.querySelector('.run-cost');
    cost.textContent = runCostText(r.costUsd);
    cost.classList.toggle('unpriced', r.costUsd === null);
    const selected = current && current.runId === r.runId;
    li.classList.toggle('selected', !!selected);
    const a = li.querySelector('a');
    if (selected) a.setAttribute('aria-current', 'true'); else a.removeAttribute('aria-current');
  }

  // ------------------------------------------------------------------ selection and routing
  function runIdFromHash() {
    const h = location.hash.replace(/^#/, '');
    if (!h) return null;
    try { return decodeURIComponent(h); } catch { return h; }
  }

  function select(runId) {
    if (current && current.runId === runId && current.alive) return;
    if (current) current.destroy();
    current = null;
    hideRunError(false);
    if (!runId) {
      $('run').hidden = true;
      $('welcome').hidden = false;
      document.title = 'little inspector';
      renderRuns();
      return;
    }
    $('welcome').hidden = true;
    $('run').hidden = false;
    $('run-title').textContent = runId;
    document.title = `${runId} · little inspector`;
    resetRunPanels();
    stepsPinned = true;
    $('follow').checked = true;
    current = new RunView(runId);
    renderRuns();
    if (!RUN_ID_RE.test(runId)) {
      // Still ask the server (it is the judge), but say what we expect.
      showRunError('This does not look like a run id (run_ followed by 1–80 of A–Z a–z 0–9 _ -).', true);
    }
    current.start();
  }

  function resetRunPanels() {
    setStatus($('run-status'), 'pending');
    for (const id of ['run-started', 'run-finished', 'run-duration', 'run-workflow']) $(id).textContent = '—';
    $('run-events').textContent = '0';
    for (const id of ['total-input', 'total-cached', 'total-output', 'total-reasoning']) $(id).textContent = '0';
    $('total-cost').textContent = '—';
    $('total-cost-note').textContent = '';
    $('run-extra').textContent = '';
    $('steps').replaceChildren();
    $('steps-count').textContent = '';
    $('bars-models').replaceChildren();
    $('bars-steps').replaceChildren();
    clearTimeline();
  }

  // ------------------------------------------------------------------ boot
  window.__inspector = {
    get view() { return current; },
    set view(_) { /* read-only for tests */ },
    debug() {
      if (!current) return null;
      return { runId: current.runId, lastContig: current.lastContig, above: [...current.above], held: current.held,
        rendered: current.rows.size, stats: { ...current.stats }, types: current.types.size,
        lastResyncReason: current.lastResyncReason || null, live: !!current.es && current.es.readyState === 1 };
    },
  };

  function boot() {
    $('timeline').addEventListener('click', (e) => {
      const head = e.target.closest('.ev-head');
      if (!head || !current) return;
      current.expand(head.parentElement);
    });
    $('runs-filter').addEventListener('input', renderRuns);
    $('timeline').addEventListener('scroll', () => {
      const list = $('timeline');
      if (current && current.autoScrolling) { current.autoScrolling = false; return; }
      // Scrolling up to read stops following new events; scrolling back to the end resumes it.
      $('follow').checked = list.scrollHeight - list.scrollTop - list.clientHeight < 40;
    }, { passive: true });
    $('steps').addEventListener('scroll', () => {
      const list = $('steps');
      stepsPinned = list.scrollHeight - list.scrollTop - list.clientHeight < 30;
    }, { passive: true });
    $('follow').addEventListener('change', () => {
      const list = $('timeline');
      if ($('follow').checked) list.scrollTop = list.scrollHeight;
    });
    window.addEventListener('hashchange', () => select(runIdFromHash()));
    select(runIdFromHash());
    // One request at a time, and the next one RUNS_POLL_MS after the last answer: on a large
    // world a listing takes seconds, and requests sent on a fixed interval piled up on the server.
    const pollRunsForever = async () => {
      await pollRuns().catch(() => {});
      setTimeout(pollRunsForever, RUNS_POLL_MS);
    };
    pollRunsForever();
    setInterval(() => { for (const li of $('runs').children) { const r = runsState.list.find((x) => x.runId === li.dataset.runId); if (r) li.querySelector('.run-time').textContent = fmtAgo(r.lastRecordedAt); } }, 5000);
  }
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', boot);
  else boot();
})();
