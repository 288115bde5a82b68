// The run list: newest first, a page at a time from /api/runs, narrowed by status on the server
// and by id on the page, the shown run marked. Polling refreshes the first page alone; "Load more"
// reads the page after the last run listed.
import { getJson } from './api.js';
import { $, el } from './dom.js';
import { fmtAgo, fmtInt, isObj, num, runCostText } from './format.js';

/** Runs per page. */
const RUNS_PAGE = 100;

/**
 * The runs listed, newest first, and the cursor of the page after the last of them (null: there
 * is none). `status` is the status filter ('' for every run); `extended` is whether pages past
 * the first have been asked for.
 */
export const runsState = { list: [], cursor: null, error: null, status: '', extended: false, loadingMore: false };
/** Bumped when the filter changes: an answer to a request of an earlier filter is dropped. */
let generation = 0;
/** The run view shown, if any (see `showingView`). */
let shownView = () => null;

/** Tell the list which run view is shown: its run is marked, and told the count the list has. */
export function showingView(get) {
  shownView = get;
}

function pageUrl(cursor) {
  const q = new URLSearchParams({ limit: String(RUNS_PAGE) });
  if (runsState.status) q.set('status', runsState.status);
  if (cursor) q.set('cursor', cursor);
  return `/api/runs?${q}`;
}

/** A page as the server answered it, or an Error for an answer that is not one. */
async function fetchPage(cursor) {
  // A request that never comes back must not end the polling: given up on after a minute.
  const body = await getJson(pageUrl(cursor), AbortSignal.timeout(60_000));
  if (!isObj(body) || !Array.isArray(body.runs)) throw new Error('the server did not answer with a page of runs');
  return {
    runs: body.runs.filter((r) => isObj(r) && typeof r.runId === 'string'),
    cursor: typeof body.cursor === 'string' && body.cursor ? body.cursor : null,
  };
}

/** Whether run `a` comes after run `b` newest first: by last event time, then id, both descending. */
const after = (a, b) => a.lastRecordedAt < b.lastRecordedAt || (a.lastRecordedAt === b.lastRecordedAt && a.runId < b.runId);

/**
 * Take a fresh first page. Before "Load more" it is the list. After, it stands for every run up
 * to its last one, and the runs listed past that stay, with the cursor that follows them.
 */
function mergeFirstPage(page) {
  const head = page.runs;
  let kept = [];
  if (runsState.extended && page.cursor !== null && head.length > 0) {
    const ids = new Set(head.map((r) => r.runId));
    const last = head[head.length - 1];
    kept = runsState.list.filter((r) => !ids.has(r.runId) && after(r, last));
  }
  runsState.list = kept.length ? head.concat(kept) : head;
  if (kept.length === 0) runsState.cursor = page.cursor;
}

/** Refresh the first page (one request), and tell the shown run the count its row has. */
export async function pollRuns() {
  const asked = generation;
  try {
    const page = await fetchPage(null);
    if (asked !== generation) return;
    mergeFirstPage(page);
    runsState.error = null;
  } catch (err) {
    if (asked !== generation) return;
    runsState.error = err.message;
  }
  renderRuns();
  const current = shownView();
  if (current && current.alive) {
    const r = runsState.list.find((x) => x.runId === current.runId);
    if (r) current.noteCount(num(r.lastSequence ?? r.eventCount));
  }
}

/** Read the page after the last run listed, and add the runs not listed yet. */
export async function loadMoreRuns() {
  if (runsState.cursor === null || runsState.loadingMore) return;
  const asked = generation;
  // From now on a poll keeps the runs past the first page (see mergeFirstPage).
  runsState.extended = true;
  runsState.loadingMore = true;
  renderRuns();
  try {
    const page = await fetchPage(runsState.cursor);
    if (asked !== generation) return;
    const listed = new Set(runsState.list.map((r) => r.runId));
    runsState.list = runsState.list.concat(page.runs.filter((r) => !listed.has(r.runId)));
    runsState.cursor = page.cursor;
    runsState.error = null;
  } catch (err) {
    if (asked === generation) runsState.error = err.message;
  } finally {
    if (asked === generation) runsState.loadingMore = false;
    renderRuns();
  }
}

/** List the runs of another status ('' for all): the first page of it, at once. */
export function filterRunsByStatus(status) {
  if (status === runsState.status) return;
  generation += 1;
  Object.assign(runsState, { list: [], cursor: null, error: null, status, extended: false, loadingMore: false });
  renderRuns();
  return pollRuns();
}

export function renderRuns() {
  const ul = $('runs');
  const filter = $('runs-filter').value.trim().toLowerCase();
  const more = runsState.cursor !== null;
  $('runs-status').textContent = runsState.error ? `server unreachable (${runsState.error})` : `${fmtInt(runsState.list.length)}${more ? '+' : ''} run${runsState.list.length === 1 && !more ? '' : 's'}`;
  $('runs-status').classList.toggle('error', !!runsState.error);
  const shown = filter ? runsState.list.filter((r) => r.runId.toLowerCase().includes(filter)) : runsState.list;
  $('runs-empty').hidden = runsState.list.length > 0 || !!runsState.error;
  $('runs-empty').textContent = runsState.status ? `No ${runsState.status} runs.` : 'No runs recorded yet.';
  $('runs-more').hidden = !more;
  $('runs-more').disabled = runsState.loadingMore;
  $('runs-more').textContent = runsState.loadingMore ? 'Loading…' : 'Load more';
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

/** Redraw each row's "last event" time ("5s ago" ages without a poll). */
export function refreshRunTimes() {
  const byId = new Map(runsState.list.map((r) => [r.runId, r]));
  for (const li of $('runs').children) {
    const r = byId.get(li.dataset.runId);
    if (r) li.querySelector('.run-time').textContent = fmtAgo(r.lastRecordedAt);
  }
}

/** A run's status as its badge shows it: the run list knows every status the server lists. */
function listStatus(s) {
  return typeof s === 'string' && /^[a-z_]{1,24}$/.test(s) ? s : 'pending';
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
  const status = listStatus(r.status);
  const badge = li.querySelector('.status');
  badge.dataset.status = status;
  badge.textContent = status.replace('_', ' ');
  li.dataset.status = status;
  li.querySelector('.run-count').textContent = `${fmtInt(r.eventCount)} events`;
  const time = li.querySelector('.run-time');
  time.textContent = fmtAgo(r.lastRecordedAt);
  time.title = typeof r.lastRecordedAt === 'string' ? `last event ${r.lastRecordedAt}` : '';
  const cost = li.querySelector('.run-cost');
  cost.textContent = runCostText(r.costUsd);
  cost.classList.toggle('unpriced', r.costUsd === null);
  const current = shownView();
  const selected = current && current.runId === r.runId;
  li.classList.toggle('selected', !!selected);
  const a = li.querySelector('a');
  if (selected) a.setAttribute('aria-current', 'true'); else a.removeAttribute('aria-current');
}
