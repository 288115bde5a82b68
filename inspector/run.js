// The selected run's view: its backlog, the live stream, gap resyncs and the state from /state.
import { getJson, isReset, knownTypes, readSse, runUrl } from './api.js';
import { renderBars } from './bars.js';
import { $, el } from './dom.js';
import { fmtDuration, fmtInt, isObj, num, parseTime } from './format.js';
import { hideRunError, renderHeader, setLive, showRunError } from './header.js';
import { renderSteps } from './steps.js';
import { clearTimeline, eventRow, showNoEvents } from './timeline.js';

const MAX_ROWS = 2000; // timeline rows kept in the DOM
const STATE_MIN_INTERVAL_MS = 250; // /state is fetched at most this often
const BEHIND_GRACE_MS = 1200; // how long events may be "in flight" before we call it a hole
const FILL_IDLE_MS = 2500; // a gap fill gives up after this long without progress
const FILL_DEADLINE_MS = 20000;

/** Draw a run's state: the header, and the steps and bars panels. */
function renderState(view, st) {
  renderHeader(view, st);
  if (num(st.eventCount) === 0 && view.held === 0) showNoEvents(st.status);
  renderSteps(st);
  renderBars(st);
}

/**
 * One run, shown live: holds which sequences it has (contiguous up to `lastContig`, and any past a
 * hole in `above`), keeps the last MAX_ROWS rows in the timeline, and redraws from /state.
 *
 * Its streams resume from `<lastContig>:<eventId of that event>`, so the server can tell when the
 * run is no longer the history shown (deleted and started again, or a store that lost commits):
 * it then sends `event: reset`, and the view ends itself and calls `onReset`, which shows the run
 * again from the start. A /state count below what the view held when it asked says the same.
 */
export class RunView {
  constructor(runId, { onReset } = {}) {
    this.runId = runId;
    this.alive = true;
    this.onReset = onReset;
    // Which sequences we hold: every s <= lastContig, plus `above` (held, past a hole), each
    // with its event id.
    this.lastContig = 0;
    this.lastContigId = ''; // the event id at lastContig, once an event there was received
    this.above = new Map();
    this.maxSeq = 0;
    this.types = new Set(knownTypes);
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
    // The server's last frame when the stream's resume point is no longer the run's history. An
    // event whose type is `reset` comes by this name too: its data is an envelope, not a reset.
    this.onResetEvent = (e) => { if (e instanceof MessageEvent && isReset(e.data)) this.historyChanged('reset'); };
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
    if (this.alive) this.openStream();
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

  /**
   * Where a stream resumes: `<lastContig>:<its event id>`, as the stream's `id:` lines name an
   * event, or the bare sequence when no event there was received (nothing yet, or the first
   * events of a long run, which are not read).
   */
  resumePoint() {
    if (this.lastContig > 0 && this.lastContigId) return `${this.lastContig}:${encodeURIComponent(this.lastContigId)}`;
    return String(this.lastContig);
  }

  /**
   * What this view shows is no longer the run's history: it ends, and `onReset` shows the run
   * again from the start.
   */
  historyChanged(why) {
    if (!this.alive) return;
    console.info(`inspector: ${this.runId} changed on the server (${why}); showing it again from the start`);
    this.destroy();
    if (this.onReset) this.onReset(why);
  }

  // ---- stream
  openStream() {
    this.closeStream();
    if (!this.alive) return;
    this.stats.reopens += 1;
    const es = new EventSource(`${runUrl(this.runId, 'events')}?after=${this.resumePoint()}`);
    this.es = es;
    for (const t of this.types) es.addEventListener(t, this.onMessage);
    es.addEventListener('message', this.onMessage); // a server that sends unnamed events
    es.addEventListener('reset', this.onResetEvent);
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
    if (!Number.isSafeInteger(seq) || seq < 1 || typeof env.eventId !== 'string') return false;
    if (typeof env.runId === 'string' && env.runId !== this.runId) return false;
    if (seq <= this.lastContig || this.above.has(seq)) { this.stats.duplicates += 1; return false; }
    if (typeof env.type === 'string') this.learnType(env.type);
    if (seq === this.lastContig + 1) {
      this.lastContig = seq;
      this.lastContigId = env.eventId;
      for (let id; (id = this.above.get(this.lastContig + 1)) !== undefined;) {
        this.above.delete(this.lastContig + 1);
        this.lastContig += 1;
        this.lastContigId = id;
      }
    } else {
      this.above.set(seq, env.eventId);
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
    // Fewer events than the view held when it asked: the run is no longer the history shown.
    const heldAtAsk = this.lastContig;
    const ctrl = new AbortController();
    this.stateCtrl = ctrl;
    try {
      const st = await getJson(runUrl(this.runId, 'state'), ctrl.signal);
      if (!this.alive) return null;
      if (!isObj(st)) throw new Error('state is not an object');
      if (num(st.eventCount) < heldAtAsk) {
        this.historyChanged('fewer events');
        return null;
      }
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
      // 404: the run has no events yet. Its stream waits for the first, and the state is fetched
      // again when it comes.
      if (err.status === 404) {
        if (heldAtAsk > 0) this.historyChanged('no events');
        else if (this.held === 0) showNoEvents('pending');
        return null;
      }
      showRunError(`Could not load state: ${err.message}`, true);
      return null;
    } finally {
      this.stateInFlight = false;
      if (this.stateDirty && this.alive) { this.stateDirty = false; this.scheduleState(); }
    }
  }

  /**
   * The server says `count` events exist (from /state or /api/runs). Catch up if we lag; fewer
   * than we hold (a run deleted and started again, or an answer read before our last events came)
   * is checked by the next /state read, which compares with what we held when it asked.
   */
  noteCount(count) {
    if (count < this.lastContig) { this.scheduleState(); return; }
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
          this.openStream();
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
        `${runUrl(this.runId, 'events')}?after=${this.resumePoint()}`,
        (type, data) => {
          if (type === 'reset' && isReset(data)) { this.historyChanged('reset'); return; }
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
