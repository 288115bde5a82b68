// Formatting for the page: numbers, token counts, dollars, times and durations, short previews.

export const isObj = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);
export const num = (v) => (typeof v === 'number' && Number.isFinite(v) ? v : 0);
const intFmt = new Intl.NumberFormat('en-US');
export const fmtInt = (n) => intFmt.format(Math.round(num(n)));
export function fmtShort(n) {
  n = num(n);
  if (n >= 1e9) return (n / 1e9).toFixed(n >= 1e10 ? 0 : 1) + 'B';
  if (n >= 1e6) return (n / 1e6).toFixed(n >= 1e7 ? 0 : 1) + 'M';
  if (n >= 1e4) return (n / 1e3).toFixed(n >= 1e5 ? 0 : 1) + 'k';
  return fmtInt(n);
}
export function fmtUsd(n) {
  if (n === 0) return '$0.00';
  if (n >= 100) return '$' + n.toFixed(2);
  if (n >= 1) return '$' + n.toFixed(3);
  if (n >= 0.01) return '$' + n.toFixed(4);
  return '$' + n.toFixed(6);
}
/** A UsageTotals' cost as { text, note, unpriced }: null is UNPRICED, never "$0". */
export function costOf(u) {
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
export function runCostText(c) {
  if (c === null || c === undefined) return 'unpriced';
  return typeof c === 'number' ? fmtUsd(c) : '—';
}
export const tokensOf = (u) => (isObj(u) ? num(u.inputTokens) + num(u.outputTokens) : 0);
export function parseTime(iso) {
  const t = typeof iso === 'string' ? Date.parse(iso) : NaN;
  return Number.isFinite(t) ? t : null;
}
const pad = (n, w = 2) => String(n).padStart(w, '0');
export function fmtClock(iso) {
  const t = parseTime(iso);
  if (t === null) return '—';
  const d = new Date(t);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}
export function fmtDateTime(iso) {
  const t = parseTime(iso);
  if (t === null) return '—';
  const d = new Date(t);
  const today = new Date();
  const sameDay = d.toDateString() === today.toDateString();
  const time = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  return sameDay ? time : `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${time}`;
}
export function fmtDuration(ms) {
  if (!Number.isFinite(ms) || ms < 0) return '—';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} m ${Math.floor(s % 60)} s`;
  const h = Math.floor(m / 60);
  return `${h} h ${m % 60} m`;
}
export function fmtAgo(iso) {
  const t = parseTime(iso);
  if (t === null) return '—';
  const s = Math.max(0, (Date.now() - t) / 1000);
  if (s < 5) return 'just now';
  if (s < 60) return `${Math.floor(s)}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
  return fmtDateTime(iso);
}
export function clip(s, n = 160) {
  s = String(s).replace(/\s+/g, ' ').trim();
  return s.length > n ? s.slice(0, n - 1) + '…' : s;
}
export function preview(v, n = 80) {
  if (v === undefined) return '';
  if (typeof v === 'string') return JSON.stringify(clip(v, n));
  let s;
  try { s = JSON.stringify(v); } catch { s = String(v); }
  return clip(s === undefined ? String(v) : s, n);
}
export function statusWord(s) {
  return ['pending', 'running', 'completed', 'failed'].includes(s) ? s : 'pending';
}
export function errMsg(e) {
  if (isObj(e)) return clip(String(e.message ?? e.code ?? preview(e)), 120);
  return e === undefined ? '' : clip(String(e), 120);
}
