//! Reading a stream of the store as run events (or session events): the display read and the
//! replay read.
//!
//! A stored row is an envelope; as a run event it is its payload's fields plus `type`, `runId`
//! (or `sessionId`), `timestamp` (= `recordedAt`) and `sequenceNumber` (= `sequence`). The
//! display read drops a row whose type this build does not know (a newer writer's) and throws on
//! a known type whose body does not parse; the replay read refuses the whole log when any row
//! would be dropped, naming the rows.

use super::{is_known_type, parse_stored, Stream};
use little_world_kernel::canonical;
use little_world_kernel::error::{Result, WorldError};
use little_world_kernel::store::LogReader;
use serde_json::{Map, Value};

/// The stream a stored id names.
pub fn stream_of(stream_id: &str) -> Stream {
    if stream_id.starts_with("ses_") {
        Stream::Session
    } else {
        Stream::Run
    }
}

/// Whether a type that would be dropped may be named in the replay's refusal: a name of letters,
/// digits and `_.:` (`iteration:started`, `StepStarted`, `harness.model.responded`) that does not
/// look like a credential. A credential pasted into a type is never shown.
fn is_shown_type(t: &str) -> bool {
    t.len() <= 64
        && t.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.:".contains(&b))
        && !crate::secrets::looks_like_credential(t)
}

/// A stream's events as run (or session) events, as one canonical JSON array text. With
/// `strict`, refuse with `ReplayRefused` when any row would be dropped.
pub fn read_log(reader: &dyn LogReader, stream_id: &str, strict: bool) -> Result<String> {
    let stream = stream_of(stream_id);
    let id_key = match stream {
        Stream::Run => "runId",
        Stream::Session => "sessionId",
    };
    let mut out = String::from("[");
    let mut dropped: Vec<(u64, String)> = Vec::new();
    let mut dense = little_world_kernel::store::Dense::after(stream_id, 0);
    reader.rows(stream_id, 0, None, &mut |row| {
        dense.check(row.sequence)?;
        let corrupt = |reason: String| WorldError::EventLogCorrupt {
            run_id: Some(stream_id.to_string()),
            sequence: Some(row.sequence),
            reason,
        };
        if !is_known_type(row.event_type) {
            dropped.push((row.sequence, row.event_type.to_string()));
            return Ok(());
        }
        // As deep as an append may nest (1,000 levels), not serde_json's default 128.
        let envelope: Value =
            canonical::parse_around(row.envelope, 1).map_err(|e| corrupt(format!("the stored envelope {e}")))?;
        let Some(Value::Object(payload)) = envelope.get("payload") else {
            return Err(corrupt("the stored envelope has no payload object".into()));
        };
        // The payload is parsed and written out again here anyway; hashing it costs little more.
        let canonical_payload = canonical::to_string(&envelope["payload"]);
        if little_world_kernel::ids::event_id(stream_id, row.sequence, row.event_type, &canonical_payload)
            != row.event_id
        {
            return Err(corrupt("the stored event does not hash to its eventId".into()));
        }
        parse_stored(stream, row.event_type, payload).map_err(|e| match e {
            WorldError::EventLogCorrupt { reason, .. } => corrupt(reason),
            other => other,
        })?;
        let mut event: Map<String, Value> = payload.clone();
        event.insert("type".into(), Value::String(row.event_type.to_string()));
        event.insert(id_key.into(), Value::String(stream_id.to_string()));
        event.insert("timestamp".into(), Value::String(row.recorded_at.to_string()));
        event.insert("sequenceNumber".into(), Value::from(row.sequence));
        if out.len() > 1 {
            out.push(',');
        }
        out.push_str(&canonical::to_string(&Value::Object(event)));
        Ok(())
    })?;
    out.push(']');
    if strict && !dropped.is_empty() {
        let shown: Vec<String> = dropped
            .iter()
            .take(20)
            .map(|(s, t)| match is_shown_type(t) {
                true => format!("sequence {s} ({t})"),
                false => format!("sequence {s} (a type that is not shown)"),
            })
            .collect();
        let more = if dropped.len() > 20 {
            format!(" and {} more", dropped.len() - 20)
        } else {
            String::new()
        };
        // Rows appended with appendEvent are the usual cause (a run id given both kinds of
        // event); a run event of a newer version is the other.
        let why = if dropped.iter().all(|(_, t)| crate::log_types::is_known(t)) {
            "events appended with appendEvent are not run events: a stream holds run events only, so give the two kinds of event different run ids"
        } else {
            "an event appended with appendEvent is not a run event (give the two kinds of event different run ids), and a run event of a newer version needs a newer @little-workflow/world"
        };
        return Err(WorldError::ReplayRefused {
            run_id: stream_id.to_string(),
            reason: format!(
                "{} row(s) that are not run events this build knows would be dropped, and a replay cannot skip what it does not understand: {}{more}; {why}",
                dropped.len(),
                shown.join(", ")
            ),
            sequences: dropped.iter().map(|(s, _)| *s).collect(),
        });
    }
    Ok(out)
}
