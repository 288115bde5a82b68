// The timeline: a row per event, with a one-line summary of its payload.
import { knownTypes } from './api.js';
import { $, el } from './dom.js';
import { clip, errMsg, fmtClock, fmtInt, fmtUsd, isObj, num, preview } from './format.js';

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
export function summarize(env) {
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
export function typeCategory(t) {
  if (!knownTypes.has(t)) return 'custom';
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
export function eventRow(env) {
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
export function clearTimeline() {
  const list = $('timeline');
  list.replaceChildren();
  list.dataset.count = '0';
  list.dataset.lastSeq = '0';
  $('timeline-note').hidden = true;
}

/** Say that the run has no events yet, unless the timeline shows something already. */
export function showNoEvents(status) {
  const list = $('timeline');
  if (!list.firstElementChild) {
    list.append(el('li', 'timeline-empty', status === 'pending'
      ? 'No events yet: the run is pending. New events appear here as they are recorded.'
      : 'No events.'));
  }
}
