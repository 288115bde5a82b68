//! The run-event vocabulary (a sister engine's `RunEvent` / `SessionEvent`).
//!
//! This module owns the pure rules of that vocabulary, so the append path, the store, N-API and
//! `world.ts` only call in:
//! - [`validate_draft`] / [`validate_event`]: strict validation on write (a draft is the event without its envelope):
//!   the type belongs to the stream, every field has its type and closed enum, the
//!   cross-field refinements hold, no envelope field is smuggled in, and no credential is carried
//!   ([`check_secrets`]).
//! - [`parse_stored`]: the tolerant display read's one distinction: an unknown
//!   type is a newer writer (drop the row), a known type that does not parse is corruption.
//! - [`restore_costs`]: the cost fold rules (realized = max over durable absolute totals,
//!   conservative = commitments less releases), independent of row order.
//! - [`fold`]: a run's status, nodes, pending gates and media jobs, budget and timeout state.
//! - [`is_run_terminal`] / [`node_terminal`]: what the store needs to keep "nothing after a run's
//!   terminal" and "exactly one terminal per node".
//!
//! Every refusal is a [`WorldError::validation`] rooted at `event` (`event.error.code`), and no
//! message carries a payload value.

mod costs;
mod fold;
mod log;
mod refine;
mod shapes;
pub mod stored;
#[cfg(test)]
mod tests;

use crate::secrets;
pub use crate::secrets::{check_secrets, looks_like_credential, screen_str};
pub use costs::{restore_costs, CostRestore};
pub use fold::fold;

use crate::rules::check_fields;
use little_world_kernel::catalog::StatusChange;
use little_world_kernel::error::{Result, WorldError};
use little_world_kernel::vocabulary::{Effects, Estimate};
use serde_json::{Map, Value};
use shapes::{shape, Carried};

pub use little_world_kernel::vocabulary::Stream;

/// The envelope fields the world stamps; a draft must not carry them.
pub const ENVELOPE_FIELDS: &[&str] = &["runId", "sessionId", "timestamp", "sequenceNumber"];

/// Whether `t` is a type of the RunEvent union (including the dual-envelope ones).
pub fn is_run_type(t: &str) -> bool {
    shape(t).is_some_and(|s| s.carried != Carried::Session)
}

/// Whether `t` is a type of the SessionEvent side: `session:*` plus the dual-envelope types a
/// session carries.
pub fn is_session_type(t: &str) -> bool {
    shape(t).is_some_and(|s| s.carried != Carried::Run)
}

/// Every type a stream of `stream` holds, in the order of the vocabulary's table.
pub fn known_types(stream: Stream) -> Vec<&'static str> {
    shapes::SHAPES
        .iter()
        .filter(|(_, s)| match stream {
            Stream::Run => s.carried != Carried::Session,
            Stream::Session => s.carried != Carried::Run,
        })
        .map(|(t, _)| *t)
        .collect()
}

/// Whether `t` is any type of either union (for the tolerant/strict read split).
pub fn is_known_type(t: &str) -> bool {
    shape(t).is_some()
}

/// Strictly validate a draft for `stream`: its type belongs to the stream, every field of the
/// type checks out (types, closed enums, non-negative safe integers, ISO-8601 instants, the
/// cross-field refinements), no envelope field is present, and no credential is carried. Unknown extra fields
/// are allowed (additive evolution).
pub fn validate_draft(stream: Stream, draft: &Map<String, Value>) -> Result<()> {
    let Some(t) = draft.get("type").and_then(Value::as_str) else {
        return Err(WorldError::validation(
            "event.type",
            "must be a string naming the event type",
        ));
    };
    validate_event(stream, t, draft)
}

/// [`validate_draft`] with the type given apart from the fields, as `appendEvent` holds a
/// colon-namespaced event (`type` + `payload`). `fields` may carry `type`; it must then be `t`.
pub fn validate_event(stream: Stream, t: &str, fields: &Map<String, Value>) -> Result<()> {
    // Screen first: every later message may name the type.
    secrets::screen_str(t, "event.type")?;
    secrets::check_map(fields, "event")?;
    if fields.get("type").is_some_and(|ft| ft.as_str() != Some(t)) {
        return Err(WorldError::validation(
            "event.type",
            format!("must be {t}, the event's type"),
        ));
    }
    if let Some(field) = ENVELOPE_FIELDS.iter().find(|f| fields.contains_key(**f)) {
        return Err(WorldError::validation(
            format!("event.{field}"),
            format!("a draft carries no {field}: the world stamps the envelope"),
        ));
    }
    validate_body(stream, t, fields)?;
    refine::on_write(t, fields)
}

/// A budget estimate that an event of type `t` commits or releases: its model, its
/// amount field and that amount, and whether it releases. `None` for any other type, or fields
/// that are not there.
pub fn estimate_of<'m>(t: &str, fields: &'m Map<String, Value>) -> Option<(&'m str, &'static str, u64, bool)> {
    let (field, released) = match t {
        "budget:estimate_committed" => ("estimateMicrocents", false),
        "budget:estimate_released" => ("releasedMicrocents", true),
        _ => return None,
    };
    Some((
        fields.get("model")?.as_str()?,
        field,
        crate::rules::count(fields, field)?,
        released,
    ))
}

/// Whether an unknown type may be named in an error: only when it reads as a type name. A
/// credential pasted into one (`node:x_sk-ant-…`) is not always at a place the screen looks.
fn reads_as_type_name(t: &str) -> bool {
    t.len() <= 64 && t.bytes().all(|b| b.is_ascii_lowercase() || b"_:.".contains(&b))
}

/// Validate the fields of a `t` event for `stream`, ignoring any other key (`type`, envelope).
pub(crate) fn validate_body(stream: Stream, t: &str, fields: &Map<String, Value>) -> Result<()> {
    let Some(shape) = shape(t) else {
        let named = if reads_as_type_name(t) {
            format!("{t:?} is")
        } else {
            "this type is".to_string()
        };
        return Err(WorldError::validation(
            "event.type",
            format!("{named} not a type of the run-event or session-event union"),
        ));
    };
    match (stream, shape.carried) {
        (Stream::Session, Carried::Run) => {
            return Err(WorldError::validation(
                "event.type",
                format!("{t} is run-only: a session stream never carries it"),
            ))
        }
        (Stream::Run, Carried::Session) => {
            return Err(WorldError::validation(
                "event.type",
                format!("{t} belongs to the session stream: a run never carries it"),
            ))
        }
        _ => {}
    }
    for group in shape.fields {
        check_fields(t, fields, group, "event")?;
    }
    shape.refine.map_or(Ok(()), |refine| refine(fields))
}

/// Whether a run-event type ends the run (`run:completed` / `run:failed` / `run:cancelled`).
pub fn is_run_terminal(t: &str) -> bool {
    matches!(t, "run:completed" | "run:failed" | "run:cancelled")
}

/// The node a node-terminal event ends (`node:completed` / `node:failed` / `node:skipped`).
pub fn node_terminal(t: &str, draft: &Map<String, Value>) -> Option<String> {
    match t {
        "node:completed" | "node:failed" | "node:skipped" => draft.get("nodeId")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// Every type that can end a stream or a node (see [`terminal`]).
pub const TERMINAL_TYPES: &[&str] = &[
    "run:completed",
    "run:failed",
    "run:cancelled",
    "session:cancelled",
    "node:completed",
    "node:failed",
    "node:skipped",
];

/// What an event of type `t` on `stream` ends: `""` for the stream itself (a run's end, or a
/// session's cancellation), a node's id for a node terminal, `None` for anything else, including
/// a type the stream does not carry and a node terminal without a non-empty `nodeId` (which an
/// append refuses, and which an earlier version stored as a plain fact).
pub fn terminal(stream: Stream, t: &str, fields: &Map<String, Value>) -> Option<String> {
    let carried = match stream {
        Stream::Run => is_run_type(t),
        Stream::Session => is_session_type(t),
    };
    if !carried {
        None
    } else if is_run_terminal(t) || t == "session:cancelled" {
        Some(String::new())
    } else {
        node_terminal(t, fields).filter(|node| !node.is_empty())
    }
}

/// Parse one stored run/session event body for the tolerant display read: `Ok(None)` when `t` is
/// a type this build does not know (a newer writer: drop the row); `Ok(Some(()))` when it
/// validates; [`WorldError::EventLogCorrupt`] when the type is known and the body does not
/// validate (including a known type stored on the wrong stream). The body may or may not carry
/// `type` and envelope fields; a `type` that disagrees with `t` is corruption. Secrets are not
/// re-screened here: that is a write-side rule, and this is a shape parse.
pub fn parse_stored(stream: Stream, t: &str, draft: &Map<String, Value>) -> Result<Option<()>> {
    if !is_known_type(t) {
        return Ok(None);
    }
    let corrupt = |reason: String| log::corrupt(None, None, reason);
    if draft.get("type").is_some_and(|dt| dt.as_str() != Some(t)) {
        return Err(corrupt(format!("stored {t} body names another type")));
    }
    validate_body(stream, t, draft).map_err(|e| corrupt(format!("stored {t} does not parse: {e}")))?;
    Ok(Some(()))
}

/// The run-event vocabulary, as the kernel asks it: a colon-namespaced type it knows is held to
/// it exactly as a draft is, a stream's end and its nodes' ends are kept beside the log, and the
/// runs catalog follows the run-event fold (a session is `open` until `session:cancelled`).
pub struct RunEvents;

/// The budget types, whose estimates are kept beside the log (see [`estimate_of`]).
const ESTIMATE_TYPES: &[&str] = &["budget:estimate_committed", "budget:estimate_released"];

impl little_world_kernel::vocabulary::Vocabulary for RunEvents {
    fn knows(&self, t: &str) -> bool {
        t.contains(':') && is_known_type(t)
    }

    fn check(&self, stream: Stream, t: &str, fields: &Map<String, Value>) -> Result<()> {
        validate_event(stream, t, fields)
    }

    fn root(&self) -> &'static str {
        "event"
    }

    fn takes_drafts(&self) -> bool {
        true
    }

    fn screens_ids(&self) -> bool {
        true
    }

    fn effects(&self, stream: Stream, t: &str, fields: &Map<String, Value>) -> Effects {
        Effects {
            terminal: terminal(stream, t, fields),
            estimate: estimate_of(t, fields).map(|(model, field, amount, released)| Estimate {
                model: model.to_string(),
                field,
                amount,
                released,
            }),
            usage: None,
        }
    }

    fn check_stored(&self, stream_id: &str, t: &str, fields: &Map<String, Value>) -> Result<()> {
        parse_stored(stored::stream_of(stream_id), t, fields).map(|_| ())
    }

    fn effect_types(&self) -> &'static [&'static str] {
        static TYPES: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
        TYPES.get_or_init(|| TERMINAL_TYPES.iter().chain(ESTIMATE_TYPES).copied().collect())
    }

    /// A stream's end and its nodes' ends where the reads see one: the row passes the reads' own
    /// check of a stored body ([`parse_stored`], which screens no credential and no envelope
    /// field, as an append does). A row an earlier version stored as a plain fact that the reads
    /// refuse (a `run:completed` without its fields, a `node:completed` without a `nodeId`, a
    /// `session:cancelled` in a run) ends nothing: taken for the run's end, it would refuse every
    /// later append to a run that reads as running.
    fn stored_effects(&self, stream_id: &str, t: &str, fields: &Map<String, Value>) -> Effects {
        let stream = stored::stream_of(stream_id);
        let mut effects = self.effects(stream, t, fields);
        if !matches!(parse_stored(stream, t, fields), Ok(Some(()))) {
            effects.terminal = None;
        }
        effects
    }

    fn status_change(&self, stream_id: &str, t: &str, _payload: &Map<String, Value>) -> Option<StatusChange> {
        use StatusChange::{Keep, Set};
        if stored::stream_of(stream_id) == Stream::Session {
            return Some(if t == "session:cancelled" {
                Set("cancelled")
            } else {
                Keep
            });
        }
        self.knows(t).then_some(match t {
            "run:completed" => Set("completed"),
            "run:failed" => Set("failed"),
            "run:cancelled" => Set("cancelled"),
            "human_gate:paused" | "budget:paused" | "run:paused" => Set("paused"),
            "run:timeout" => Keep,
            _ => Set("running"),
        })
    }

    fn initial_status(&self, stream_id: &str) -> Option<&'static str> {
        (stored::stream_of(stream_id) == Stream::Session).then_some("open")
    }
}
