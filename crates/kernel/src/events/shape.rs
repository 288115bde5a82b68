//! The shape of a committed log: what `validateEventLogShape` and `little verify` check.
//!
//! A replayable log is one run's envelopes with sequences `1..=n` in order, each with the event id
//! its content hashes to, a canonical payload and (for keyed appends) the request digest its
//! content hashes to. Anything else is corruption, reported with the run and sequence.

use crate::canonical;
use crate::error::{Result, WorldError};
use crate::ids;
use serde_json::Value;

fn corrupt(run_id: Option<&str>, sequence: Option<u64>, reason: impl Into<String>) -> WorldError {
    WorldError::EventLogCorrupt {
        run_id: run_id.map(str::to_string),
        sequence,
        reason: reason.into(),
    }
}

/// Check a whole log given as a JSON array of envelopes.
pub fn check_log_text(text: &str) -> Result<()> {
    let value = canonical::parse_around(text, 2).map_err(|e| corrupt(None, None, format!("the log {e}")))?;
    let Value::Array(events) = value else {
        return Err(corrupt(None, None, "expected an array of envelopes"));
    };
    check_log(&events)
}

/// Check a whole log: one run, dense 1-based sequences in order, each envelope sound.
pub fn check_log(events: &[Value]) -> Result<()> {
    let mut run: Option<&str> = None;
    for (i, event) in events.iter().enumerate() {
        let expected = i as u64 + 1;
        let this_run = event.get("runId").and_then(Value::as_str);
        match (run, this_run) {
            (None, Some(r)) => run = Some(r),
            (Some(r), Some(t)) if r != t => {
                return Err(corrupt(
                    Some(r),
                    Some(expected),
                    format!("envelope at index {i} belongs to another run ({t})"),
                ))
            }
            _ => {}
        }
        let sequence = event.get("sequence").and_then(Value::as_u64);
        if sequence != Some(expected) {
            let found = sequence.map_or("no sequence".to_string(), |s| format!("sequence {s}"));
            return Err(corrupt(
                run,
                Some(expected),
                format!("envelope at index {i} has {found}; a dense log has {expected} there"),
            ));
        }
        check_envelope(event)?;
    }
    Ok(())
}

/// Check one envelope: required fields, its event id, its request digest.
pub fn check_envelope(event: &Value) -> Result<()> {
    let run_id = event.get("runId").and_then(Value::as_str);
    let sequence = event.get("sequence").and_then(Value::as_u64);
    let bad = |reason: String| corrupt(run_id, sequence, reason);
    let obj = event
        .as_object()
        .ok_or_else(|| bad("an envelope must be an object".into()))?;
    let field = |name: &str| obj.get(name).and_then(Value::as_str);
    let (Some(run_id), Some(sequence)) = (run_id, sequence) else {
        return Err(bad("an envelope needs a string runId and an integer sequence".into()));
    };
    if sequence == 0 {
        return Err(bad("sequences start at 1".into()));
    }
    let (Some(event_type), Some(event_id), Some(_)) = (field("type"), field("eventId"), field("recordedAt")) else {
        return Err(bad("an envelope needs string type, eventId and recordedAt".into()));
    };
    let payload = obj
        .get("payload")
        .filter(|p| p.is_object())
        .ok_or_else(|| bad("payload must be an object".into()))?;
    let canonical_payload = canonical::to_string(payload);
    let want = ids::event_id(run_id, sequence, event_type, &canonical_payload);
    if event_id != want {
        return Err(bad(format!(
            "eventId {event_id} does not match its content (expected {want})"
        )));
    }
    match (field("appendIdempotencyKey"), field("canonicalRequestDigest")) {
        (Some(_), Some(digest)) => {
            let want = ids::request_digest(run_id, event_type, &canonical_payload);
            if digest != want {
                return Err(bad(format!(
                    "canonicalRequestDigest {digest} does not match its content"
                )));
            }
        }
        (Some(_), None) => return Err(bad("appendIdempotencyKey without canonicalRequestDigest".into())),
        (None, Some(_)) => return Err(bad("canonicalRequestDigest without appendIdempotencyKey".into())),
        (None, None) => {}
    }
    Ok(())
}
