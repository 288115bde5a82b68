// The server's API: JSON fetches, the event stream read with fetch, and the known event types.
import { isObj } from './format.js';

/** GET `url` as JSON; a refusal throws an Error with the server's message and `status`. */
export async function getJson(url, signal) {
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
export const runUrl = (runId, what) => `/api/runs/${encodeURIComponent(runId)}/${what}`;

/**
 * The event types the server's package knows, of every vocabulary (`GET /api/types`): empty until
 * loaded, and if that fails. A type not in it is drawn as a custom one.
 */
export const knownTypes = new Set();

/** Load the known event types, once; a failure leaves every type custom, and the page working. */
export async function loadKnownTypes() {
  try {
    const t = await getJson('/api/types', AbortSignal.timeout(10_000));
    for (const list of isObj(t) ? [t.events, t.runEvents, t.sessionEvents] : []) {
      if (Array.isArray(list)) for (const type of list) if (typeof type === 'string') knownTypes.add(type);
    }
  } catch (err) {
    console.warn('inspector: the known event types could not be loaded; every type is shown as custom', err);
  }
}

/**
 * Whether an SSE frame's data is the server's `reset`: the stream's resume point is no longer the
 * run's history, and the run must be read again from the start. Its data has a code and no
 * eventId, unlike the envelope of an event whose type is `reset`.
 */
export function isReset(data) {
  let d;
  try { d = JSON.parse(data); } catch { return false; }
  return isObj(d) && d.code === 'EVENT_LOG_CORRUPT' && !('eventId' in d);
}

// SSE parsing for gap fills
/**
 * Read `/events?after=N` with fetch and parse the SSE frames ourselves. EventSource only
 * dispatches event names it has listeners for, so an event of a type nobody predicted (a user's
 * `my.custom.fact`) can only be fetched this way. Calls onEvent(type, data) per frame until
 * shouldStop() or the stream ends or stalls.
 */
export async function readSse(url, onEvent, shouldStop, signal) {
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
