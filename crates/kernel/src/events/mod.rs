//! The append rules: one path for every event that enters the log.
//!
//! An append goes through two pure-ish steps. [`prepare`] checks everything that does not depend
//! on what is already stored (ids, the payload's JSON, the known type's shape, `costUsd`, artifact
//! references) and produces the canonical payload and the request digest. [`commit_units`] then
//! runs inside one write transaction of a backend: for each unit of prepared appends (one append,
//! or a group that commits whole), in a savepoint of its own, it answers an idempotent retry from
//! the stored row, or takes the next dense sequence, builds the envelope and inserts it. A
//! rejected append writes nothing and consumes no sequence.

mod commit;
mod envelope;
pub mod packed;
mod payload;
pub mod shape;

pub use commit::{commit_batch, commit_imported, commit_now, commit_units, AppendOutcome, ImportedEvent, UnitOutcome};
#[cfg(test)]
use envelope::DIGEST_PLACEHOLDER;
use envelope::{fill_placeholder, Head, EVENT_ID_PLACEHOLDER};
pub use envelope::{sequence_of, EnvelopeFields, HeadLayout};
use payload::offload_large_values;
pub use payload::{check_payload, parse_payload, put_strings_back};

use crate::artifacts::{artifact_id, ArtifactStore, Encoding, NewArtifact};
use crate::catalog::{self, StatusChange};
use crate::error::{Result, WorldError};
use crate::ids;
use crate::json_path::JsonPath;
use crate::store::LogReader;
use crate::vocabulary::{self, Effects, Stream, Usage, Vocabulary};
use serde_json::{Map, Value};

/// The index through which a stream names the run that owns it: an entry whose key is the
/// stream's id and whose value is the run's, written by the stream's own append. Deleting the run
/// (or pruning it) deletes the stream too, in the same transaction: a Workflow SDK run's stream
/// and queue-message logs are such streams. An entry may only name a run that holds events, so
/// that nothing written after a run's deletion (a step still running then) makes a stream the
/// deletion can no longer reach.
pub const OWNER_INDEX: &str = "little.owner";

/// Longest event type name.
pub const MAX_TYPE_LEN: usize = 256;
/// Longest idempotency key.
pub const MAX_KEY_LEN: usize = 1024;

/// An append as the caller asked for it.
#[derive(Debug, Clone)]
pub struct AppendRequest {
    /// The stream: a run id, or a session id for a session event.
    pub run_id: String,
    /// The type (ignored for a run-event draft, whose type is its own `type` field).
    pub event_type: String,
    /// The payload as JSON text (for a run-event draft: the draft, `type` included).
    pub payload_json: String,
    /// Strings of the payload sent beside its JSON text, which holds `"\u0000<index>"` in the
    /// place of each. When any are sent, every string value of the text that starts with U+0000
    /// is such a placeholder. Long strings travel this way because serializing them to JSON on
    /// the caller's thread costs several times what copying them does.
    pub strings: Vec<String>,
    pub key: Option<String>,
    /// `Some` for `appendRunEvent` / `appendSessionEvent`: the payload is a run-event draft.
    pub draft: Option<Stream>,
    /// Commit only if the stream's last sequence is this one (0: it has none yet).
    pub expected_sequence: Option<u64>,
    /// Index entries written with the event, in its transaction.
    pub index: Vec<IndexWrite>,
}

impl AppendRequest {
    /// Check the id of the stream appended to: a session's for a session draft, else a run's.
    pub fn check_stream_id(&self) -> Result<()> {
        match self.draft {
            Some(Stream::Session) => ids::check_session_id(&self.run_id),
            _ => ids::check_run_id(&self.run_id),
        }
    }
}

/// An index entry an append sets (`value` some) or removes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IndexWrite {
    pub index: String,
    pub key: String,
    pub value: Option<String>,
}

/// Most index entries one append may write.
pub const MAX_INDEX_WRITES: usize = 64;
/// Longest index name, key or value.
pub const MAX_INDEX_LEN: usize = 1024;

/// Index writes from their JSON: an array of `{"index", "key", "value"}`, `value` a string or
/// `null`.
pub fn index_writes_from_json(text: &str) -> Result<Vec<IndexWrite>> {
    serde_json::from_str(text).map_err(|e| {
        WorldError::validation(
            "index",
            format!("must be an array of {{ index, key, value }} with string index and key and a string or null value ({e})"),
        )
    })
}

/// Check an append's index writes: at most [`MAX_INDEX_WRITES`], names and keys of 1 to
/// [`MAX_INDEX_LEN`] bytes and values of at most that, none holding U+0000.
fn check_index(writes: &[IndexWrite]) -> Result<()> {
    if writes.len() > MAX_INDEX_WRITES {
        return Err(WorldError::validation(
            "index",
            format!("at most {MAX_INDEX_WRITES} entries may be written by one append"),
        ));
    }
    for (i, w) in writes.iter().enumerate() {
        let fields = [
            ("index", Some(&w.index), 1),
            ("key", Some(&w.key), 1),
            ("value", w.value.as_ref(), 0),
        ];
        for (name, text, min) in fields {
            let Some(text) = text else { continue };
            if text.len() < min || text.len() > MAX_INDEX_LEN || text.contains('\0') {
                return Err(WorldError::validation(
                    format!("index[{i}].{name}"),
                    format!("must be a string of {min} to {MAX_INDEX_LEN} bytes without U+0000"),
                ));
            }
        }
    }
    Ok(())
}

/// An append whose payload is checked and canonical, ready for a write transaction.
#[derive(Debug, Clone)]
pub struct PreparedAppend {
    pub run_id: String,
    pub event_type: String,
    /// The envelope's canonical text from its `{` through the payload, with a placeholder for the
    /// event id (it depends on the sequence); the writer fills it in at
    /// [`PreparedAppend::id_at`] and appends the rest (see [`EnvelopeFields::write_tail`]), so a
    /// payload is never copied again after canonicalization. Room for the rest is reserved.
    pub head: String,
    /// Where the event id goes in `head`, as [`EnvelopeFields::write_head`] wrote it.
    pub id_at: usize,
    /// Where the payload starts in `head`.
    pub payload_at: usize,
    pub key: Option<String>,
    pub digest: Option<String>,
    /// For a run-event terminal: the node it ends, or `""` when it ends the run (or session).
    pub terminal: Option<String>,
    /// The event-id hash with the payload already absorbed (see [`ids::event_id_prefix`]).
    pub id_prefix: sha2::Sha256,
    /// A budget estimate the append commits or releases, checked by the writer against what the
    /// stream has committed and released so far.
    pub estimate: Option<Estimate>,
    /// The token counts the event adds to its run's totals (a vocabulary's
    /// [`crate::vocabulary::Effects::usage`]), checked by the writer: a total past 2^53 - 1
    /// is one the materializer cannot sum exactly, so accepting it would leave the run unfoldable.
    pub usage: Option<Usage>,
    /// A large value the payload refers to instead of carrying it, stored by the writer only once
    /// the append has passed every check against the stored rows, so that a refused append
    /// (an idempotency conflict, a run already ended) leaves no artifact behind.
    pub spill: Option<Spill>,
    /// Why a keyed append's payload is refused, told only once its key has been looked up (see
    /// [`answer_refused`]): a retry of an append stored before gets its envelope back, as every
    /// retry does, even when a rule added since refuses the payload (an earlier version stored
    /// it under looser rules). Such an append never reaches the writer and writes nothing.
    pub refused: Option<WorldError>,
    /// See [`AppendRequest::expected_sequence`].
    pub expected_sequence: Option<u64>,
    /// See [`AppendRequest::index`].
    pub index: Vec<IndexWrite>,
    /// How the event changes its stream's status in the runs catalog.
    pub status: StatusChange,
}

/// A run-event budget estimate: `budget:estimate_committed` commits an amount to a
/// model's conservative bucket, and `budget:estimate_released` gives part of it back. The writer
/// refuses a release of more than the model has committed and not released, and a commitment
/// that would take the stream's conservative total past 2^53 - 1: the cost restore reads either
/// as a damaged log, so accepting one would leave the run's costs unrestorable for good.
#[derive(Debug, Clone)]
pub struct Estimate {
    pub model: String,
    pub amount: u64,
    pub released: bool,
    /// The amount's field, as the caller named it (`event.releasedMicrocents` for a draft).
    pub at: String,
}

/// The estimate a vocabulary found, with its field named from `root`, as the caller named the
/// payload (`event` for a draft, `payload` for `appendEvent`).
fn estimate_at(e: crate::vocabulary::Estimate, root: &str) -> Estimate {
    Estimate {
        at: format!("{root}.{}", e.field),
        model: e.model,
        amount: e.amount,
        released: e.released,
    }
}

/// The artifacts of a world, as the append rules use them.
impl Artifacts for ArtifactStore {
    fn artifact_exists(&self, artifact_id: &str) -> Result<bool> {
        ArtifactStore::exists(self, artifact_id)
    }

    fn json_id(&self, run_id: &str, step_path: &str, name: &str, canonical_json: &str) -> String {
        artifact_id(
            &json_meta(run_id, step_path, name),
            &ids::sha256_tagged(canonical_json.as_bytes()),
        )
    }

    fn store_json(&self, run_id: &str, step_path: &str, name: &str, canonical_json: String) -> Result<String> {
        self.write(
            json_meta(run_id, step_path, name),
            crate::artifacts::Data::Canonical(canonical_json),
        )
        .map(|m| m.artifact_id)
    }
}

/// What describes a large value an append moved into a `json` artifact.
fn json_meta(run_id: &str, step_path: &str, name: &str) -> NewArtifact {
    NewArtifact {
        run_id: run_id.to_string(),
        step_path: step_path.to_string(),
        name: name.to_string(),
        content_type: "application/json".to_string(),
        encoding: Encoding::Json,
    }
}

/// A large output, args or result moved out of a payload into a `json` artifact.
#[derive(Debug, Clone)]
pub struct Spill {
    pub step_path: String,
    /// The field it was moved out of: the artifact's name.
    pub name: &'static str,
    /// Its canonical JSON.
    pub text: String,
    /// The artifact's id, which the payload's `…Ref` field already names.
    pub artifact_id: String,
}

/// What the append rules need of the artifact store.
pub trait Artifacts: Send + Sync {
    /// Whether `artifact_id` (`art_…`) is published in the world.
    fn artifact_exists(&self, artifact_id: &str) -> Result<bool>;
    /// The id [`Artifacts::store_json`] gives this canonical JSON text, without storing it.
    fn json_id(&self, run_id: &str, step_path: &str, name: &str, canonical_json: &str) -> String;
    /// Publish a canonical JSON text as a `json` artifact; returns its id.
    fn store_json(&self, run_id: &str, step_path: &str, name: &str, canonical_json: String) -> Result<String>;
}

/// Outputs, args and results this large (as canonical JSON) or larger are stored as artifacts.
pub const INLINE_LIMIT: usize = 256_000;

/// A check's refusal kept for later (`Ok(Some(_))`) when it is a keyed append's refusal for what
/// its payload holds (see [`PreparedAppend::refused`]); any other failure is returned.
fn deferred(keyed: bool, checked: Result<()>) -> Result<Option<WorldError>> {
    match checked {
        Ok(()) => Ok(None),
        Err(e) if keyed && e.code() == "EVENT_VALIDATION" => Ok(Some(e)),
        Err(e) => Err(e),
    }
}

/// Check an append against every rule that does not depend on stored rows.
pub fn prepare(mut req: AppendRequest, artifacts: &dyn Artifacts) -> Result<PreparedAppend> {
    req.check_stream_id()?;
    let run = req.run_id.clone();
    let for_run = |e: WorldError| e.for_run(&run);
    // The vocabulary that holds this append: the one that takes drafts for a draft, else the
    // one that knows its type (an unknown type is a generic fact, a newer writer's).
    let vocabulary = match req.draft {
        Some(_) => vocabulary::drafts(),
        None => vocabulary::owner(&req.event_type),
    };
    screen_ids(&req, vocabulary)?;
    let capacity = envelope_capacity(&req);
    let mut payload = parse_payload(&req.payload_json).map_err(for_run)?;
    if !req.strings.is_empty() {
        put_strings_back(&mut payload, std::mem::take(&mut req.strings)).map_err(for_run)?;
    }
    // A draft, and any type of the vocabulary that takes drafts, is held to its vocabulary
    // before the append's own type, index writes and key are checked; any other type after.
    let held = if req.draft.is_some() || vocabulary.is_some_and(|v| v.takes_drafts()) {
        let held = hold_to(vocabulary, &mut req, &mut payload).map_err(for_run)?;
        check_request(&req).map_err(for_run)?;
        held
    } else {
        check_request(&req).map_err(for_run)?;
        hold_to(vocabulary, &mut req, &mut payload).map_err(for_run)?
    };
    // A keyed append's refusal for what its payload holds is kept, not returned (see `refused`).
    // Only the first counts, as when it was returned at once: no check after it runs.
    let refused = match held.refused {
        Some(e) => Some(e),
        None => deferred(req.key.is_some(), check_payload(&payload, artifacts)).map_err(for_run)?,
    }
    .map(for_run);
    // Large values are moved out of a refused payload too, so that its digest is the one stored
    // for the same request before; nothing is stored for it.
    let spill = vocabulary
        .and_then(|v| v.spillable(&req.event_type, &payload))
        .and_then(|s| offload_large_values(s, &mut payload, &run, artifacts));
    let Effects {
        terminal,
        estimate,
        usage,
    } = held.effects;
    let (terminal, estimate, spill, usage, status) = match refused {
        Some(_) => (None, None, None, None, StatusChange::Keep),
        None => (
            terminal,
            estimate.map(|e| estimate_at(e, held.estimate_root)),
            spill,
            usage,
            catalog::status_change(&req.run_id, &req.event_type, &payload),
        ),
    };
    let head = Head::write(&req, payload, capacity);
    Ok(PreparedAppend {
        run_id: req.run_id,
        event_type: req.event_type,
        head: head.text,
        id_at: head.id_at,
        payload_at: head.payload_at,
        id_prefix: head.id_prefix,
        key: req.key,
        digest: head.digest,
        terminal,
        estimate,
        usage,
        spill,
        refused,
        expected_sequence: req.expected_sequence,
        index: req.index,
        status,
    })
}

/// Refuse a credential in the stream's id or the idempotency key of an append whose vocabulary
/// screens them, before any error could name the stream.
fn screen_ids(req: &AppendRequest, vocabulary: Option<&dyn Vocabulary>) -> Result<()> {
    if !vocabulary.is_some_and(|v| v.screens_ids()) {
        return Ok(());
    }
    let id_field = if req.draft == Some(Stream::Session) {
        "sessionId"
    } else {
        "runId"
    };
    vocabulary::screen(&req.run_id, id_field)?;
    if let Some(key) = &req.key {
        vocabulary::screen(key, "appendIdempotencyKey").map_err(|e| e.for_run(&req.run_id))?;
    }
    Ok(())
}

/// What the envelope will take, at least (canonical JSON is rarely longer than its input).
fn envelope_capacity(req: &AppendRequest) -> usize {
    req.payload_json.len()
        + req.strings.iter().map(String::len).sum::<usize>()
        + 2 * req.run_id.len()
        + 2 * req.event_type.len()
        + 2 * req.key.as_ref().map_or(0, String::len)
        + 256
}

/// What an append's vocabulary said of it.
struct Held {
    effects: Effects,
    /// Where the paths of its estimate's errors start.
    estimate_root: &'static str,
    /// A keyed append's refusal for what its payload holds (see [`deferred`]).
    refused: Option<WorldError>,
}

/// Hold an append to its vocabulary. A draft is validated strictly, and its own `type` field
/// becomes the envelope's type and the rest the payload; a known type's errors are named from
/// `payload`; an unknown type is held to nothing here.
fn hold_to(
    vocabulary: Option<&dyn Vocabulary>,
    req: &mut AppendRequest,
    payload: &mut Map<String, Value>,
) -> Result<Held> {
    let mut held = Held {
        effects: Effects::default(),
        estimate_root: "payload",
        refused: None,
    };
    match (req.draft, vocabulary) {
        (Some(stream), Some(v)) => {
            let Some(Value::String(t)) = payload.get("type") else {
                return Err(WorldError::validation(
                    format!("{}.type", v.root()),
                    "must be a string naming the event type",
                ));
            };
            let t = t.clone();
            v.check(stream, &t, payload)?;
            payload.remove("type");
            req.event_type = t;
            held.effects = v.effects(stream, &req.event_type, payload);
            held.estimate_root = v.root();
        }
        (Some(_), None) => {
            return Err(WorldError::validation(
                "event",
                "this build registers no vocabulary that takes drafts",
            ))
        }
        (None, Some(v)) => {
            let p = JsonPath::new("payload").render();
            let checked = v
                .check(Stream::Run, &req.event_type, payload)
                .map_err(|e| rebase(e, v.root(), &p));
            held.refused = deferred(req.key.is_some(), checked)?;
            held.effects = v.effects(Stream::Run, &req.event_type, payload);
        }
        (None, None) => {}
    }
    Ok(held)
}

/// The rules of an append's type, index writes and idempotency key.
fn check_request(req: &AppendRequest) -> Result<()> {
    check_type(&req.event_type)?;
    check_index(&req.index)?;
    match &req.key {
        Some(key) if key.is_empty() || key.len() > MAX_KEY_LEN => Err(WorldError::validation(
            "appendIdempotencyKey",
            format!("must be a non-empty string of at most {MAX_KEY_LEN} bytes"),
        )),
        None if vocabulary::requires_key(&req.event_type) => Err(WorldError::validation(
            "appendIdempotencyKey",
            format!("{} appends require an appendIdempotencyKey", req.event_type),
        )),
        _ => Ok(()),
    }
}

/// The answer to an append prepared with a refusal: the stored envelope when this very request
/// (its key and digest) was stored before, else the refusal. A read, so it never waits for the
/// writer or another process's write lock; if the read fails, the refusal stands.
pub fn answer_refused(reader: &dyn LogReader, prepared: PreparedAppend) -> Result<String> {
    let refusal = prepared.refused.unwrap_or_else(|| WorldError::RuntimeIntegrity {
        reason: "an append without a refusal was answered as refused".into(),
    });
    if let (Some(key), Some(digest)) = (&prepared.key, &prepared.digest) {
        if let Ok(Some(found)) = reader.find_by_key(&prepared.run_id, key) {
            if &found.digest == digest {
                return Ok(found.envelope);
            }
        }
    }
    Err(refusal)
}

impl PreparedAppend {
    /// The canonical payload, as prepared.
    pub fn payload(&self) -> &str {
        &self.head[self.payload_at..]
    }
}

/// Re-root a validation error's path (`event.nodeId` → `payload.nodeId`).
fn rebase(e: WorldError, from: &str, to: &str) -> WorldError {
    match e {
        WorldError::Validation { run_id, path, message } => WorldError::Validation {
            run_id,
            path: match path.strip_prefix(from) {
                Some(rest) => format!("{to}{rest}"),
                None => path,
            },
            message,
        },
        other => other,
    }
}

fn check_type(event_type: &str) -> Result<()> {
    if event_type.is_empty() || event_type.len() > MAX_TYPE_LEN || event_type.chars().any(char::is_control) {
        return Err(WorldError::validation(
            "type",
            format!("must be a non-empty string of at most {MAX_TYPE_LEN} bytes without control characters"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
