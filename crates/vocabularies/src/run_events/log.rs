//! Reading a run's stored events for the cost restore and the fold.
//!
//! Both take full run events (the draft's fields plus the envelope). A row of a type this build
//! does not know is skipped: it is a newer writer's, and refusing such a hole is the replay read's
//! job (`loadRunEventLogForReplay`), not a fold's. A row of a known type is re-validated against
//! the run stream; a body that does not validate, a broken envelope, a session envelope or rows of
//! two runs in one list mean the log is damaged: [`WorldError::EventLogCorrupt`].

use super::{is_known_type, validate_body, Stream};
use crate::rules::as_count;
use little_world_kernel::error::{Result, WorldError};
use little_world_kernel::numbers::is_count;
use serde_json::{Map, Value};

/// One known run event, borrowed from the caller's list.
pub(super) struct Row<'v> {
    pub t: &'v str,
    pub fields: &'v Map<String, Value>,
    pub sequence: Option<u64>,
}

/// A corruption report at an event of the log. A list given by the caller is not validated yet:
/// its run id is reported only if [`is_shown_run_id`].
pub(super) fn corrupt(run_id: Option<&str>, sequence: Option<u64>, reason: impl Into<String>) -> WorldError {
    WorldError::EventLogCorrupt {
        run_id: run_id.filter(|r| is_shown_run_id(r)).map(str::to_string),
        sequence,
        reason: reason.into(),
    }
}

/// Whether `r` is a run id (`run_` and 1-80 of `[A-Za-z0-9_-]`) that may appear in an error: not
/// one with a credential in it, after the prefix or any other underscore (`run_sk-ant-…`), where
/// the screen, which looks for credentials that start a word, would not see it. (Appends take
/// such ids, so lists of them restore and fold; errors about them just do not name them.)
fn is_shown_run_id(r: &str) -> bool {
    little_world_kernel::ids::check_run_id(r).is_ok()
        && !r
            .match_indices('_')
            .any(|(i, _)| crate::secrets::looks_like_credential(&r[i + 1..]))
}

/// The known rows of `events`, each validated; unknown types skipped.
pub(super) fn read_run_events(events: &[Value]) -> Result<Vec<Row<'_>>> {
    let mut rows = Vec::with_capacity(events.len());
    let mut run: Option<&str> = None;
    for (i, v) in events.iter().enumerate() {
        let Some(obj) = v.as_object() else {
            return Err(corrupt(run, None, format!("run event #{i} is not an object")));
        };
        let sequence = match obj.get("sequenceNumber") {
            None => None,
            Some(s) if is_count(s) => as_count(s),
            Some(_) => {
                return Err(corrupt(
                    run,
                    None,
                    format!("run event #{i}: sequenceNumber is not a count"),
                ))
            }
        };
        match obj.get("runId") {
            None => {}
            Some(Value::String(r)) if !r.is_empty() && run.is_none_or(|first| first == r) => run = Some(r),
            Some(Value::String(r)) if !r.is_empty() => {
                let first = run.unwrap_or_default();
                let name = |id: &str| match is_shown_run_id(id) {
                    true => id.to_string(),
                    false => "a run id that is not shown".to_string(),
                };
                return Err(corrupt(
                    run,
                    sequence,
                    format!("the list mixes two runs ({} after {})", name(r), name(first)),
                ));
            }
            Some(_) => return Err(corrupt(run, sequence, "runId is not a non-empty string")),
        }
        let here = |reason: String| corrupt(run, sequence, reason);
        if obj.contains_key("sessionId") {
            return Err(here("a run event carries no sessionId".into()));
        }
        if obj
            .get("timestamp")
            .is_some_and(|ts| !ts.as_str().is_some_and(crate::iso::is_instant))
        {
            return Err(here("timestamp is not an ISO-8601 date-time".into()));
        }
        let Some(t) = obj.get("type").and_then(Value::as_str) else {
            return Err(here("the event has no string type".into()));
        };
        if !is_known_type(t) {
            continue;
        }
        validate_body(Stream::Run, t, obj)
            .map_err(|e| corrupt(run, sequence, format!("stored {t} does not parse: {e}")))?;
        rows.push(Row {
            t,
            fields: obj,
            sequence,
        });
    }
    Ok(rows)
}
