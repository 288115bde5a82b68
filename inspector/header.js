// The run's header: status, times, totals, the live indicator and the run's error line.
import { $, setStatus } from './dom.js';
import { costOf, errMsg, fmtDateTime, fmtDuration, fmtInt, fmtUsd, isObj, num, parseTime, preview } from './format.js';

/** The live indicator: `live` while the event stream is open, `reconnecting` otherwise. */
export function setLive(state) {
  const n = $('live-indicator');
  n.textContent = state === 'live' ? 'live' : 'reconnecting';
  n.dataset.state = state;
}

/** kind: 'soft' (a transient note), 'failed' (the run's own error), 'hard' (cannot show the run). */
export function showRunError(msg, soft) {
  const n = $('run-error');
  n.hidden = false;
  n.textContent = msg;
  n.dataset.kind = soft === true ? 'soft' : soft || 'hard';
}
export function hideRunError(onlySoft) {
  const n = $('run-error');
  if (onlySoft && n.dataset.kind === 'hard') return;
  n.hidden = true;
  n.textContent = '';
  n.dataset.kind = '';
}

/** Draw the header from a run's state; `view` holds the events the page has. */
export function renderHeader(view, st) {
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
}
