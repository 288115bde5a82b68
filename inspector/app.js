// little inspector: lists runs and shows one run live (timeline, steps, tokens and cost).
// Plain browser JavaScript in ES modules, no dependencies, no build step. Talks only to its own
// origin: GET /api/types, GET /api/runs, GET /api/runs/:id/state, GET /api/runs/:id/events
// (Server-Sent Events). Every piece of run data reaches the DOM through textContent or
// setAttribute, never innerHTML.
import { loadKnownTypes } from './api.js';
import { $, setStatus } from './dom.js';
import { hideRunError } from './header.js';
import { RunView } from './run.js';
import { filterRunsByStatus, loadMoreRuns, pollRuns, refreshRunTimes, renderRuns, showingView } from './runs.js';
import { pinSteps } from './steps.js';
import { clearTimeline } from './timeline.js';

const RUNS_POLL_MS = 3000;

let current = null; // RunView

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
  show(runId);
}

/** Show a run from the start: empty panels, and a new view that reads it. */
function show(runId) {
  resetRunPanels();
  pinSteps(true);
  $('follow').checked = true;
  current = new RunView(runId, { onReset: () => reload(runId) });
  renderRuns();
  // The server judges the id: one it refuses (400) is said in the run's error line.
  current.start();
}

let reloads = 0;

/**
 * The shown run is no longer the history the page holds (deleted and started again, or a store
 * that lost commits): drop what is shown and read it again from the start.
 */
function reload(runId) {
  if (!current || current.runId !== runId) return;
  reloads += 1;
  current.destroy();
  hideRunError(false);
  show(runId);
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

// For tests: the shown run view, and a summary of what it holds.
window.__inspector = {
  get view() { return current; },
  set view(_) { /* read-only for tests */ },
  debug() {
    if (!current) return null;
    return { runId: current.runId, lastContig: current.lastContig, above: [...current.above.keys()], held: current.held, reloads,
      rendered: current.rows.size, stats: { ...current.stats }, types: current.types.size,
      lastResyncReason: current.lastResyncReason || null, live: !!current.es && current.es.readyState === 1 };
  },
};

async function boot() {
  showingView(() => current);
  $('timeline').addEventListener('click', (e) => {
    const head = e.target.closest('.ev-head');
    if (!head || !current) return;
    current.expand(head.parentElement);
  });
  $('runs-filter').addEventListener('input', renderRuns);
  $('runs-state').addEventListener('change', () => filterRunsByStatus($('runs-state').value));
  $('runs-more').addEventListener('click', loadMoreRuns);
  $('timeline').addEventListener('scroll', () => {
    const list = $('timeline');
    if (current && current.autoScrolling) { current.autoScrolling = false; return; }
    // Scrolling up to read stops following new events; scrolling back to the end resumes it.
    $('follow').checked = list.scrollHeight - list.scrollTop - list.clientHeight < 40;
  }, { passive: true });
  $('steps').addEventListener('scroll', () => {
    const list = $('steps');
    pinSteps(list.scrollHeight - list.scrollTop - list.clientHeight < 30);
  }, { passive: true });
  $('follow').addEventListener('change', () => {
    const list = $('timeline');
    if ($('follow').checked) list.scrollTop = list.scrollHeight;
  });
  // The run list needs no types: it is polled at once.
  pollRunsForever();
  // A run is shown once the known event types are in (or their request failed): its stream
  // listens for each of them by name.
  await loadKnownTypes();
  window.addEventListener('hashchange', () => select(runIdFromHash()));
  select(runIdFromHash());
  setInterval(refreshRunTimes, 5000);
}

// One request at a time, and the next one RUNS_POLL_MS after the last answer, so that requests
// never pile up on a slow server. Each asks for the first page of runs alone.
async function pollRunsForever() {
  await pollRuns().catch(() => {});
  setTimeout(pollRunsForever, RUNS_POLL_MS);
}

// A module script runs once the document has been parsed.
boot();
