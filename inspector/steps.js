// The steps panel: each step's status, attempts, duration, tokens and cost, nested by path.
import { $, el } from './dom.js';
import { costOf, errMsg, fmtDuration, fmtShort, isObj, num, parseTime, statusWord, tokensOf } from './format.js';

const MAX_STEP_ROWS = 1000;

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

export function renderSteps(st) {
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
/** Whether the list follows the newest steps of a running run (not while the reader scrolls up). */
export function pinSteps(pinned) {
  stepsPinned = pinned;
}
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
