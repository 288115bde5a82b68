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
pub mod packed;
pub mod shape;

pub use commit::{commit_batch, commit_imported, commit_now, commit_units, AppendOutcome, ImportedEvent, UnitOutcome};

use crate::artifacts::{artifact_id, ArtifactStore, Encoding, NewArtifact};
use crate::canonical;
use crate::catalog::{self, StatusChange};
use crate::error::{Result, WorldError};
use crate::ids;
use crate::json_path::{JsonPath, Seg};
use crate::store::LogReader;
use crate::vocabulary::{self, Effects, Spillable, Stream, Usage};
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
    let run = run.as_str();
    // The vocabulary that holds this append: the one that takes drafts for a draft, else the
    // one that knows its type (an unknown type is a generic fact, a newer writer's).
    let vocabulary = match req.draft {
        Some(_) => vocabulary::drafts(),
        None => vocabulary::owner(&req.event_type),
    };
    // Its stream's id and its idempotency key may have to pass the screens, before any error
    // could name the stream.
    if vocabulary.is_some_and(|v| v.screens_ids()) {
        let id_field = if req.draft == Some(Stream::Session) {
            "sessionId"
        } else {
            "runId"
        };
        vocabulary::screen(&req.run_id, id_field)?;
        if let Some(key) = &req.key {
            vocabulary::screen(key, "appendIdempotencyKey").map_err(|e| e.for_run(run))?;
        }
    }
    // What the envelope will take, at least (canonical JSON is rarely longer than its input).
    let capacity = req.payload_json.len()
        + req.strings.iter().map(String::len).sum::<usize>()
        + 2 * req.run_id.len()
        + 2 * req.event_type.len()
        + 2 * req.key.as_ref().map_or(0, String::len)
        + 256;
    let mut payload = parse_payload(&req.payload_json).map_err(|e| e.for_run(run))?;
    if !req.strings.is_empty() {
        put_strings_back(&mut payload, std::mem::take(&mut req.strings)).map_err(|e| e.for_run(run))?;
    }
    let mut effects = Effects::default();
    let mut estimate_root = "payload";
    // A keyed append's refusal for what its payload holds is kept, not returned (see `refused`).
    // Only the first counts, as when it was returned at once: no check after it runs.
    let mut refused = None;
    let keyed = req.key.is_some();
    match (req.draft, vocabulary) {
        (Some(stream), Some(v)) => {
            // A draft: strictly validated as its stream's vocabulary; its own `type` field
            // becomes the envelope's type and the rest the payload.
            let Some(Value::String(t)) = payload.get("type") else {
                return Err(WorldError::validation(
                    format!("{}.type", v.root()),
                    "must be a string naming the event type",
                )
                .for_run(run));
            };
            let t = t.clone();
            v.check(stream, &t, &payload).map_err(|e| e.for_run(run))?;
            payload.remove("type");
            req.event_type = t;
            effects = v.effects(stream, &req.event_type, &payload);
            estimate_root = v.root();
        }
        (Some(_), None) => {
            return Err(
                WorldError::validation("event", "this build registers no vocabulary that takes drafts").for_run(run),
            )
        }
        (None, Some(v)) => {
            // A known type is held to its vocabulary, its errors named from `payload`.
            let p = JsonPath::new("payload").render();
            let checked = v
                .check(Stream::Run, &req.event_type, &payload)
                .map_err(|e| rebase(e, v.root(), &p));
            refused = deferred(keyed, checked).map_err(|e| e.for_run(run))?;
            effects = v.effects(Stream::Run, &req.event_type, &payload);
        }
        (None, None) => {}
    }
    check_type(&req.event_type).map_err(|e| e.for_run(run))?;
    check_index(&req.index).map_err(|e| e.for_run(run))?;
    if let Some(key) = &req.key {
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return Err(WorldError::validation(
                "appendIdempotencyKey",
                format!("must be a non-empty string of at most {MAX_KEY_LEN} bytes"),
            )
            .for_run(run));
        }
    } else if vocabulary::requires_key(&req.event_type) {
        return Err(WorldError::validation(
            "appendIdempotencyKey",
            format!("{} appends require an appendIdempotencyKey", req.event_type),
        )
        .for_run(run));
    }
    if refused.is_none() {
        refused = deferred(keyed, check_payload(&payload, artifacts)).map_err(|e| e.for_run(run))?;
    }
    let refused = refused.map(|e| e.for_run(run));
    // Large values are moved out of a refused payload too, so that its digest is the one stored
    // for the same request before; nothing is stored for it.
    let spill = vocabulary
        .and_then(|v| v.spillable(&req.event_type, &payload))
        .and_then(|s| offload_large_values(s, &mut payload, run, artifacts));
    let Effects {
        terminal,
        estimate,
        usage,
    } = effects;
    let estimate = estimate.map(|e| estimate_at(e, estimate_root));
    let (terminal, estimate, spill, usage) = match refused {
        Some(_) => (None, None, None, None),
        None => (terminal, estimate, spill, usage),
    };
    let status = match refused {
        Some(_) => StatusChange::Keep,
        None => catalog::status_change(&req.run_id, &req.event_type, &payload),
    };
    let mut text = Vec::with_capacity(capacity);
    let layout = EnvelopeFields {
        event_id: EVENT_ID_PLACEHOLDER,
        run_id: &req.run_id,
        sequence: 0,
        event_type: &req.event_type,
        key: req.key.as_deref(),
        digest: req.key.as_ref().map(|_| DIGEST_PLACEHOLDER),
        recorded_at: "",
    }
    .write_head(&mut text);
    let (id_at, payload_at) = (layout.event_id, layout.payload);
    canonical::write_value(&Value::Object(payload), &mut text);
    // Only valid UTF-8 was written: string contents are copied whole from `&str`s.
    let mut head = String::from_utf8(text).expect("canonical JSON is UTF-8");
    let canonical = &head[payload_at..];
    let digest = req
        .key
        .as_ref()
        .map(|_| ids::request_digest(&req.run_id, &req.event_type, canonical));
    let id_prefix = ids::event_id_prefix(&req.run_id, canonical);
    if let (Some(d), Some(at)) = (&digest, layout.digest) {
        fill_placeholder(&mut head, at, DIGEST_PLACEHOLDER, d);
    }
    Ok(PreparedAppend {
        run_id: req.run_id,
        event_type: req.event_type,
        head,
        id_at,
        payload_at,
        id_prefix,
        key: req.key,
        digest,
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

/// Stands for an event id (`evt_` and 16 hex digits) in a prepared head.
pub(super) const EVENT_ID_PLACEHOLDER: &str = "evt_0000000000000000";

/// Stands for a request digest (`sha256:` and 64 hex digits) in a prepared head.
const DIGEST_PLACEHOLDER: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

/// Write `with` over `placeholder`, which `text` holds at `at`; both are ASCII of one length.
pub(super) fn fill_placeholder(text: &mut String, at: usize, placeholder: &str, with: &str) {
    assert!(
        with.is_ascii() && with.len() == placeholder.len() && text.get(at..at + with.len()) == Some(placeholder),
        "a placeholder is filled with what it stands for"
    );
    text.replace_range(at..at + with.len(), with);
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

/// Parse a payload's JSON text; it must be an object.
pub fn parse_payload(text: &str) -> Result<Map<String, Value>> {
    match canonical::parse(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(WorldError::validation("payload", "must be a JSON object")),
        Err(e) => Err(WorldError::validation("payload", e.to_string())),
    }
}

/// Put the strings sent beside a payload's JSON text in the places of their placeholders; each
/// must be used exactly once.
pub fn put_strings_back(payload: &mut Map<String, Value>, strings: Vec<String>) -> Result<()> {
    fn walk(v: &mut Value, strings: &mut [Option<String>]) -> std::result::Result<(), String> {
        match v {
            Value::String(s) if s.starts_with('\0') => {
                let slot = s[1..].parse::<usize>().ok().and_then(|i| strings.get_mut(i));
                *s = slot
                    .and_then(Option::take)
                    .ok_or_else(|| format!("{s:?} names no unused string sent beside the payload"))?;
                Ok(())
            }
            Value::Array(items) => items.iter_mut().try_for_each(|item| walk(item, strings)),
            Value::Object(map) => map.values_mut().try_for_each(|item| walk(item, strings)),
            _ => Ok(()),
        }
    }
    let mut slots: Vec<Option<String>> = strings.into_iter().map(Some).collect();
    payload
        .values_mut()
        .try_for_each(|v| walk(v, &mut slots))
        .and_then(|()| match slots.iter().position(Option::is_some) {
            Some(i) => Err(format!("string {i} sent beside the payload has no placeholder")),
            None => Ok(()),
        })
        .map_err(|reason| WorldError::RuntimeIntegrity {
            reason: format!("internal error: the binding sent a malformed payload: {reason}"),
        })
}

/// The payload rules every type shares.
pub fn check_payload(payload: &Map<String, Value>, artifacts: &dyn Artifacts) -> Result<()> {
    let mut path = JsonPath::new("payload");
    scan_object(payload, &mut path, artifacts)
}

/// Walk the payload: refuse `costUsd` in any usage object, and check every artifact reference.
fn scan<'v>(v: &'v Value, path: &mut JsonPath<'v>, artifacts: &dyn Artifacts) -> Result<()> {
    match v {
        Value::String(s) if ids::is_artifact_ref(s) => {
            let id = &s["artifact://".len()..];
            if !artifacts.artifact_exists(id)? {
                return Err(WorldError::ArtifactNotFound {
                    artifact_id: id.to_string(),
                    run_id: None,
                    path: Some(path.render()),
                });
            }
            Ok(())
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                path.push(Seg::Index(i));
                scan(item, path, artifacts)?;
                path.pop();
            }
            Ok(())
        }
        Value::Object(map) => scan_object(map, path, artifacts),
        _ => Ok(()),
    }
}

fn scan_object<'v>(map: &'v Map<String, Value>, path: &mut JsonPath<'v>, artifacts: &dyn Artifacts) -> Result<()> {
    for (k, v) in map {
        path.push(Seg::Key(k));
        if k == "usage" {
            if let Some(usage) = v.as_object() {
                if usage.contains_key("costUsd") {
                    return Err(WorldError::validation(
                        path.render_with("costUsd"),
                        "events are token-only: a usage object may not carry costUsd (cost is computed at materialization)",
                    ));
                }
            }
        }
        scan(v, path, artifacts)?;
        path.pop();
    }
    Ok(())
}

/// Put a reference to a `json` artifact in the place of a large output, args or result; the
/// artifact itself is stored by the writer (see [`PreparedAppend::spill`]).
fn offload_large_values(
    spillable: Spillable,
    payload: &mut Map<String, Value>,
    run_id: &str,
    artifacts: &dyn Artifacts,
) -> Option<Spill> {
    let (field, ref_field, step_path) = (spillable.field, spillable.reference, spillable.step_path);
    // A payload with both the value and its reference is refused (and only a refused one has
    // both): moving the value would overwrite the reference it gave, and could make its digest
    // that of another request.
    if payload.contains_key(ref_field) {
        return None;
    }
    let value = payload.get(field)?;
    let text = canonical::to_string(value);
    if text.len() < INLINE_LIMIT {
        return None;
    }
    let artifact_id = artifacts.json_id(run_id, &step_path, field, &text);
    payload.remove(field);
    payload.insert(
        ref_field.to_string(),
        Value::String(format!("artifact://{artifact_id}")),
    );
    Some(Spill {
        step_path,
        name: field,
        text,
        artifact_id,
    })
}

/// The sequence of a canonical envelope: its last `,"sequence":` (the type after it is a string
/// literal, whose quotes are escaped) is followed by it.
pub fn sequence_of(envelope: &str) -> Option<u64> {
    const FIELD: &str = ",\"sequence\":";
    let at = envelope.rfind(FIELD)? + FIELD.len();
    let digits = envelope[at..].split(',').next()?;
    digits.parse().ok()
}

/// Everything of an envelope but its payload. The canonical envelope is
/// `{[key,][digest,]"eventId":…,"payload":<payload>,"recordedAt":…,"runId":…,"sequence":…,"type":…}`
/// (its keys are ASCII, in sorted order); this writes the parts before and after the payload, for
/// building envelopes and for finding the payload inside a stored one.
#[derive(Debug, Clone, Copy)]
pub struct EnvelopeFields<'a> {
    pub event_id: &'a str,
    pub run_id: &'a str,
    pub sequence: u64,
    pub event_type: &'a str,
    pub key: Option<&'a str>,
    pub digest: Option<&'a str>,
    pub recorded_at: &'a str,
}

/// Where [`EnvelopeFields::write_head`] wrote what a prepared head fills in later: the byte offsets
/// in its output of the digest's and the event id's text (inside their quotes) and of the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadLayout {
    pub digest: Option<usize>,
    pub event_id: usize,
    pub payload: usize,
}

impl EnvelopeFields<'_> {
    /// Append the envelope's text up to and including `"payload":`; returns where it put the
    /// digest, the event id and where the payload goes.
    pub fn write_head(&self, out: &mut Vec<u8>) -> HeadLayout {
        use canonical::write_str;
        // A string's text starts after its opening quote.
        let text_at = |out: &Vec<u8>| out.len() + 1;
        out.push(b'{');
        if let Some(k) = self.key {
            out.extend_from_slice(b"\"appendIdempotencyKey\":");
            write_str(k, out);
            out.push(b',');
        }
        let mut digest = None;
        if let Some(d) = self.digest {
            out.extend_from_slice(b"\"canonicalRequestDigest\":");
            digest = Some(text_at(out));
            write_str(d, out);
            out.push(b',');
        }
        out.extend_from_slice(b"\"eventId\":");
        let event_id = text_at(out);
        write_str(self.event_id, out);
        out.extend_from_slice(b",\"payload\":");
        HeadLayout {
            digest,
            event_id,
            payload: out.len(),
        }
    }

    /// Append the envelope's text after the payload, from `,"recordedAt":` to the closing brace.
    pub fn write_tail(&self, out: &mut Vec<u8>) {
        use canonical::write_str;
        out.extend_from_slice(b",\"recordedAt\":");
        write_str(self.recorded_at, out);
        out.extend_from_slice(b",\"runId\":");
        write_str(self.run_id, out);
        out.extend_from_slice(b",\"sequence\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.sequence).as_bytes());
        out.extend_from_slice(b",\"type\":");
        write_str(self.event_type, out);
        out.push(b'}');
    }

    /// [`EnvelopeFields::write_tail`] onto a finished head.
    pub fn finish(&self, envelope: &mut String) {
        let mut tail = Vec::with_capacity(64 + self.run_id.len() + self.event_type.len());
        self.write_tail(&mut tail);
        envelope.push_str(&String::from_utf8(tail).expect("canonical JSON is UTF-8"));
    }
}

#[cfg(test)]
mod tests;
