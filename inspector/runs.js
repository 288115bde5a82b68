// The run list: polled from /api/runs, filtered, the shown run marked.
import { getJson } from './api.js';
import { $, el, setStatus } from './dom.js';
import { fmtAgo, fmtInt, isObj, num, runCostText, statusWord } from './format.js';

export const runsState = { list: [], error: null };
/** The run view shown, if any (see `showingView`). */
let shownView = () => null;

/** Tell the list which run view is shown: its run is marked, and told the count the list has. */
export function showingView(get) {
  shownView = get;
}

export async function pollRuns() {
  try {
    // A request that never comes back must not end the polling: given up on after a minute.
    const list = await getJson('/api/runs', AbortSignal.timeout(60_000));
    runsState.list = Array.isArray(list) ? list.filter((r) => isObj(r) && typeof r.runId === 'string') : [];
    runsState.error = null;
  } catch (err) {
    runsState.error = err.message;
  }
  renderRuns();
  const current = shownView();
  if (current && current.alive) {
    const r = runsState.list.find((x) => x.runId === current.runId);
    if (r) current.noteCount(num(r.lastSequence ?? r.eventCount));
  }
}

export function renderRuns() {
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
  const current = shownView();
  const selected = current && current.runId === r.runId;
  li.classList.toggle('selected', !!selected);
  const a = li.querySelector('a');
  if (selected) a.setAttribute('aria-current', 'true'); else a.removeAttribute('aria-current');
}
