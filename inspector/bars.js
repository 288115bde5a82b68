// Tokens and cost per model and per step, drawn as bars.
import { $, el } from './dom.js';
import { costOf, fmtInt, fmtShort, isObj, num, tokensOf } from './format.js';

const MAX_STEP_BARS = 40;

export function renderBars(st) {
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
