//! Outer-loop manifests: the cycle-level record of an outer loop, kept by a backend.
//!
//! A manifest is published whole, so a reader sees the old one or the new one, never a torn one.
//! Its `inputHash` is the identity of the loop's input: a write with another `inputHash` than the
//! stored one is refused. `pendingCycleRunId` is the crash-recovery marker: a write that leaves
//! it out keeps the stored one, and only an explicit `null` clears it.
//!
//! Within a process, the writes of one manifest take turns (see [`ManifestStore::turn`]) over the
//! whole read → check `inputHash` → merge `pendingCycleRunId` → publish. Across processes,
//! writers are expected to hold the outer-loop lock (`acquireOuterLoopLock`); two processes
//! writing without it may race the merge (the later one's `pendingCycleRunId` wins), but each
//! still publishes a whole manifest, and the `inputHash` check holds even then: the first manifest
//! is published only where none is, so only one of two first writes can place it.
//!
//! A stored manifest that is not a JSON object naming the requested `outerLoopId` and an
//! `inputHash` is corrupt ([`WorldError::RuntimeIntegrity`]); a write whose manifest does not have
//! the shape `OuterLoopManifest` has in `world.ts` is refused with [`WorldError::Validation`].
//! Fields the shape does not name are allowed and kept. `local` keeps a file per manifest,
//! `memory` a map.

pub mod local;
pub mod postgres;
pub mod r#virtual;

use crate::canonical;
use crate::error::{Result, WorldError};
use crate::numbers::is_count;
use serde_json::{Map, Value};
use std::sync::{Arc, Mutex, MutexGuard};

/// Check an outer-loop id: 1–128 of `[A-Za-z0-9_-]`, so it is safe as a file name.
pub fn check_outer_loop_id(id: &str) -> Result<()> {
    if !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        Ok(())
    } else {
        Err(WorldError::Path {
            message: format!(
                "invalid outerLoopId {}: expected 1-128 of [A-Za-z0-9_-]",
                canonical::string_literal(&id.chars().take(100).collect::<String>())
            ),
        })
    }
}

/// Where a world keeps its outer-loop manifests.
pub trait ManifestStore: Send + Sync {
    /// Where the manifest of `id` is kept, for messages (its file, say).
    fn place(&self, id: &str) -> String;
    /// The stored text of the manifest of `id`, if there is one: at most [`MANIFEST_MAX`] bytes
    /// (a larger one is `RuntimeIntegrity`, not read whole).
    fn load(&self, id: &str) -> Result<Option<Vec<u8>>>;
    /// Publish `text` as the manifest of `id`, whole: with `first`, only where none is stored
    /// (`Ok(false)` when one appeared meanwhile); else in place of the stored one.
    fn publish(&self, id: &str, text: &str, first: bool) -> Result<bool>;
    /// The mutex under which this process's writes of `id` take turns: the same one for every
    /// handle on the same manifest (two worlds on one data directory share it).
    fn turn(&self, id: &str) -> Arc<Mutex<()>>;
}

/// The outer-loop manifests of a world: the rules, over its backend.
pub struct OuterLoops {
    store: Box<dyn ManifestStore>,
}

impl OuterLoops {
    /// The manifests `store` keeps.
    pub fn new(store: impl ManifestStore + 'static) -> OuterLoops {
        OuterLoops { store: Box::new(store) }
    }

    /// The stored manifest's canonical JSON, if there is one.
    pub fn read(&self, id: &str) -> Result<Option<String>> {
        check_outer_loop_id(id)?;
        Ok(self.stored(id)?.map(|m| canonical::to_string(&Value::Object(m))))
    }

    fn stored(&self, id: &str) -> Result<Option<Map<String, Value>>> {
        self.store
            .load(id)?
            .map(|bytes| parse_stored(bytes, &self.store.place(id), id))
            .transpose()
    }

    /// Write a manifest (JSON text of an object with the shape of `OuterLoopManifest`).
    pub fn write(&self, manifest_json: &str) -> Result<()> {
        let manifest = match canonical::parse(manifest_json) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Err(WorldError::validation("manifest", "must be an object")),
            Err(e) => return Err(WorldError::validation("manifest", e.to_string())),
        };
        let id = validate(&manifest)?;
        let turn = self.store.turn(&id);
        let _turn = unpoisoned(&turn);
        // The first manifest is placed only where none is: of two processes writing it at once,
        // the second is then checked against the first's `inputHash` rather than silently replacing
        // the first's manifest. Later writes replace one with their own `inputHash`,
        // so none changes it.
        for _ in 0..ROUNDS {
            let stored = self.stored(&id)?;
            let text = merge(&id, manifest.clone(), stored.as_ref())?;
            before_publishing(&self.store.place(&id));
            if self.store.publish(&id, &text, stored.is_none())? {
                return Ok(());
            }
        }
        Err(WorldError::io(
            "publishing an outer-loop manifest",
            None,
            std::io::Error::other(format!(
                "{} kept appearing and vanishing while this write was checked",
                self.store.place(&id)
            )),
        ))
    }
}

/// How many times a write reads the stored manifest again because another process published the
/// first one meanwhile (once is all it takes unless manifests are also deleted).
const ROUNDS: usize = 8;

#[cfg(test)]
thread_local! {
    /// What a test does, as another process would, between a write's check and its publishing
    /// (given where the manifest is kept).
    static BEFORE_PUBLISHING: std::cell::RefCell<Option<Box<dyn FnMut(&str)>>> = const { std::cell::RefCell::new(None) };
}

#[cfg(test)]
fn before_publishing(place: &str) {
    BEFORE_PUBLISHING.with(|h| {
        if let Some(f) = h.borrow_mut().as_mut() {
            f(place)
        }
    });
}

#[cfg(not(test))]
#[inline(always)]
fn before_publishing(_place: &str) {}

/// Lock a mutex, ignoring poisoning: what it guards stays consistent when a holder panics.
pub(crate) fn unpoisoned<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The manifest stored at `place` (a stored text, `bytes`), checked to be a JSON object that names
/// `id` and an `inputHash`; anything else is corrupt.
fn parse_stored(bytes: Vec<u8>, place: &str, id: &str) -> Result<Map<String, Value>> {
    let corrupt = |what: String| WorldError::RuntimeIntegrity {
        reason: format!("outer-loop manifest {place} {what}"),
    };
    let Ok(text) = String::from_utf8(bytes) else {
        return Err(corrupt("is not UTF-8".into()));
    };
    let manifest = match canonical::parse(&text) {
        Ok(Value::Object(m)) => m,
        Ok(_) => return Err(corrupt("is not a JSON object".into())),
        Err(e) => return Err(corrupt(e.to_string())),
    };
    match manifest.get("outerLoopId") {
        Some(Value::String(s)) if s == id => {}
        Some(Value::String(s)) => {
            let s = canonical::string_literal(&s.chars().take(100).collect::<String>());
            return Err(corrupt(format!("has outerLoopId {s}, not {id}")));
        }
        _ => return Err(corrupt("has no outerLoopId string".into())),
    }
    if !has_input_hash(&manifest) {
        return Err(corrupt("has no inputHash string".into()));
    }
    Ok(manifest)
}

/// The most canonical JSON one manifest may hold (256 MiB). A manifest is a loop's goal and its
/// cycles, which this dwarfs, and a larger one could not become a JavaScript string on its way
/// back; a file larger than this at a manifest's path is corrupt rather than read whole (a
/// sparse file of a terabyte there once got the reading process killed for its memory).
pub const MANIFEST_MAX: usize = 256 << 20;

/// Check `manifest` against the `stored` one: refuse another `inputHash`, keep the stored
/// `pendingCycleRunId` unless the manifest sets or clears it, and refuse a result larger than
/// [`MANIFEST_MAX`]. Returns the canonical text to store.
fn merge(id: &str, manifest: Map<String, Value>, stored: Option<&Map<String, Value>>) -> Result<String> {
    let text = merged(id, manifest, stored)?;
    if text.len() > MANIFEST_MAX {
        return Err(WorldError::validation(
            "manifest",
            format!(
                "is {} bytes of canonical JSON; a manifest holds at most {MANIFEST_MAX} ({} MiB)",
                text.len(),
                MANIFEST_MAX >> 20
            ),
        ));
    }
    Ok(text)
}

fn merged(id: &str, mut manifest: Map<String, Value>, stored: Option<&Map<String, Value>>) -> Result<String> {
    if let Some(stored) = stored {
        let stored_hash = stored.get("inputHash").and_then(Value::as_str).unwrap_or("");
        let given = manifest.get("inputHash").and_then(Value::as_str).unwrap_or("");
        if stored_hash != given {
            return Err(WorldError::OuterLoopInputMismatch {
                outer_loop_id: id.to_string(),
                stored: stored_hash.to_string(),
                given: given.to_string(),
            });
        }
        if !manifest.contains_key("pendingCycleRunId") {
            if let Some(p) = stored.get("pendingCycleRunId") {
                manifest.insert("pendingCycleRunId".into(), p.clone());
            }
        }
    }
    if manifest.get("pendingCycleRunId").is_some_and(Value::is_null) {
        manifest.remove("pendingCycleRunId");
    }
    Ok(canonical::to_string(&Value::Object(manifest)))
}

/// Check a manifest's shape (`OuterLoopManifest` in `world.ts`) and return its id.
/// Optional fields may be left out; fields the shape does not name are allowed.
fn validate(m: &Map<String, Value>) -> Result<String> {
    let invalid = |path: &str, message: &str| Err(WorldError::validation(path, message));
    let Some(Value::String(id)) = m.get("outerLoopId") else {
        return invalid("manifest.outerLoopId", "must be a string");
    };
    check_outer_loop_id(id)?;
    if !has_input_hash(m) {
        return invalid("manifest.inputHash", "must be a string");
    }
    if m.get("maxCycles").is_some_and(|v| !is_count(v)) {
        return invalid("manifest.maxCycles", "must be a non-negative safe integer");
    }
    if let Some(goal) = m.get("goal") {
        let Value::Object(goal) = goal else {
            return invalid("manifest.goal", "must be an object");
        };
        for key in ["workflowDefinitionHash", "description"] {
            if goal.get(key).is_some_and(|v| !v.is_string()) {
                return invalid(&format!("manifest.goal.{key}"), "must be a string");
            }
        }
    }
    if let Some(cycles) = m.get("cycles") {
        let Value::Array(cycles) = cycles else {
            return invalid("manifest.cycles", "must be an array");
        };
        for (i, cycle) in cycles.iter().enumerate() {
            let at = format!("manifest.cycles[{i}]");
            let Value::Object(cycle) = cycle else {
                return invalid(&at, "must be an object");
            };
            let number = cycle.get("cycleNumber");
            if !number.is_some_and(|v| is_count(v) && v.as_f64().is_some_and(|n| n >= 1.0)) {
                return invalid(&format!("{at}.cycleNumber"), "must be a safe integer of at least 1");
            }
            for key in ["runId", "status"] {
                if !cycle.get(key).is_some_and(Value::is_string) {
                    return invalid(&format!("{at}.{key}"), "must be a string");
                }
            }
            if cycle.get("workflowVersionId").is_some_and(|v| !v.is_string()) {
                return invalid(&format!("{at}.workflowVersionId"), "must be a string");
            }
        }
    }
    if let Some(v) = m.get("pendingCycleRunId") {
        if !(v.is_null() || v.as_str().is_some_and(|s| crate::ids::check_run_id(s).is_ok())) {
            return invalid("manifest.pendingCycleRunId", "must be a run id or null");
        }
    }
    if let Some(result) = m.get("result") {
        let Value::Object(result) = result else {
            return invalid("manifest.result", "must be an object");
        };
        if result.get("kind").and_then(Value::as_str) != Some("done") {
            return invalid("manifest.result.kind", "must be \"done\"");
        }
    }
    Ok(id.clone())
}

/// Whether a stored manifest has an `inputHash` string (an empty one included: earlier versions
/// wrote what they were given, and such a manifest must stay readable).
fn has_input_hash(m: &Map<String, Value>) -> bool {
    matches!(m.get("inputHash"), Some(Value::String(_)))
}

#[cfg(test)]
mod tests;
