//! Listing envelopes for JavaScript without one big JSON parse.
//!
//! `JSON.parse` of a whole log (tens of megabytes) and deep-freezing every payload is most of the
//! cost of a listing, and most callers read few payloads. So a listing crosses N-API as one string
//! holding, row after row, the event id, `recordedAt`, type, idempotency key, request digest and
//! the payload's canonical JSON, plus a table of numbers saying where each piece starts; `world.ts`
//! cuts the pieces out (V8 makes those slices without copying) and decodes a payload only when it
//! is first read.

use super::EnvelopeFields;
use crate::core::error::{Result, WorldError};
use crate::core::store::{LogReader, RowRef};

/// Numbers per row in the table: the sequence, six piece starts, and the row's end.
pub const STRIDE: usize = 8;

/// A packed listing: the concatenated pieces, and per row `[sequence, eventId, recordedAt, type,
/// key, digest, payload, end]` as offsets in UTF-16 code units (JavaScript string indices).
pub struct Packed {
    pub text: String,
    pub table: Vec<f64>,
}

fn utf16_len(s: &str) -> usize {
    if s.is_ascii() {
        s.len()
    } else {
        s.encode_utf16().count()
    }
}

/// The payload's text inside a stored canonical envelope. A canonical envelope is exactly
/// `{[key,][digest,]"eventId":…,"payload":<payload>,"recordedAt":…,"runId":…,"sequence":…,"type":…}`,
/// so the text around the payload is rebuilt from the row's columns (into `scratch`) and checked
/// byte for byte; no searching. `None` when the stored text is not that envelope.
fn payload_slice<'a>(row: &RowRef<'a>, scratch: &mut Vec<u8>) -> Option<&'a str> {
    let fields = EnvelopeFields {
        event_id: row.event_id,
        run_id: row.run_id,
        sequence: row.sequence,
        event_type: row.event_type,
        key: row.key,
        digest: row.digest,
        recorded_at: row.recorded_at,
    };
    scratch.clear();
    fields.write_head(scratch);
    let head = scratch.len();
    fields.write_tail(scratch);
    let tail = scratch.len() - head;
    let env = row.envelope.as_bytes();
    let ok = env.len() > head + tail && env[..head] == scratch[..head] && env[env.len() - tail..] == scratch[head..];
    // The boundaries fall on ASCII bytes, so the slice is on char boundaries.
    ok.then(|| &row.envelope[head..env.len() - tail])
}

/// The envelopes of `run_id` after `after` (at most `limit`), packed.
pub fn list_packed(reader: &dyn LogReader, run_id: &str, after: u64, limit: Option<u64>) -> Result<Packed> {
    // Room for a typical row, so the text is not copied as it grows.
    let expected = limit.unwrap_or(1024).min(1 << 20) as usize;
    let mut text = String::with_capacity(expected * 320);
    let mut table = Vec::with_capacity(expected * STRIDE);
    // Where the next piece starts, in UTF-16 code units.
    let mut at = 0usize;
    let mut scratch = Vec::with_capacity(256);
    let push = |text: &mut String, at: &mut usize, s: &str| {
        text.push_str(s);
        let start = *at;
        *at += utf16_len(s);
        start as f64
    };
    reader.rows(run_id, after, limit, &mut |row| {
        let payload = payload_slice(&row, &mut scratch).ok_or_else(|| WorldError::EventLogCorrupt {
            run_id: Some(row.run_id.to_string()),
            sequence: Some(row.sequence),
            reason: "the stored envelope is not in canonical form".into(),
        })?;
        table.push(row.sequence as f64);
        table.push(push(&mut text, &mut at, row.event_id));
        table.push(push(&mut text, &mut at, row.recorded_at));
        table.push(push(&mut text, &mut at, row.event_type));
        table.push(push(&mut text, &mut at, row.key.unwrap_or("")));
        table.push(push(&mut text, &mut at, row.digest.unwrap_or("")));
        table.push(push(&mut text, &mut at, payload));
        table.push(at as f64);
        Ok(())
    })?;
    Ok(Packed { text, table })
}

/// Rows per part above which a listing is read by two threads at once.
const SPLIT_AT: u64 = 20_000;

/// [`list_packed`], read in two halves on two threads when the listing is large (the JavaScript
/// thread is only waiting meanwhile, so both cores can read). Parts are in sequence order.
pub fn list_packed_parallel(
    reader: &dyn LogReader,
    run_id: &str,
    after: u64,
    limit: Option<u64>,
) -> Result<Vec<Packed>> {
    let last = reader.last_sequence(run_id)?;
    let end = limit.map_or(last, |l| last.min(after.saturating_add(l)));
    let count = end.saturating_sub(after);
    if count < 2 * SPLIT_AT {
        return Ok(vec![list_packed(reader, run_id, after, limit)?]);
    }
    let mid = after + count / 2;
    let halves = std::thread::scope(|scope| {
        // At the process's thread limit, this thread reads it all (below).
        let second = crate::core::runtime::start_scoped(scope, "little-world-list", || {
            list_packed(reader, run_id, mid, Some(end - mid))
        })
        .ok()?;
        let first = list_packed(reader, run_id, after, Some(mid - after));
        let second = second
            .join()
            .unwrap_or_else(|p| Err(crate::core::runtime::panic_error(p)));
        Some((first, second))
    });
    match halves {
        Some((first, second)) => Ok(vec![first?, second?]),
        None => Ok(vec![list_packed(reader, run_id, after, limit)?]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_payload_of_a_canonical_envelope() {
        let env = r#"{"appendIdempotencyKey":"\"payload\":","canonicalRequestDigest":"sha256:x","eventId":"evt_1","payload":{"a":{"recordedAt":"x"},"runId":1},"recordedAt":"2026-01-01T00:00:00.000Z","runId":"run_a","sequence":12,"type":"t"}"#;
        let row = RowRef {
            run_id: "run_a",
            sequence: 12,
            event_id: "evt_1",
            event_type: "t",
            key: Some("\"payload\":"),
            digest: Some("sha256:x"),
            recorded_at: "2026-01-01T00:00:00.000Z",
            envelope: env,
        };
        let mut scratch = Vec::new();
        assert_eq!(
            payload_slice(&row, &mut scratch),
            Some(r#"{"a":{"recordedAt":"x"},"runId":1}"#)
        );
        let wrong = RowRef { sequence: 13, ..row };
        assert_eq!(payload_slice(&wrong, &mut scratch), None);
    }

    #[test]
    fn offsets_count_utf16_units() {
        assert_eq!(utf16_len("abc"), 3);
        assert_eq!(utf16_len("é😀"), 3);
    }
}
