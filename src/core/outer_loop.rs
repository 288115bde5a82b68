//! Outer-loop manifests: `<dataDir>/outer-loops/<outerLoopId>.json`, the cycle-level record.
//!
//! A manifest is written whole by tmp + fsync + rename (+ directory fsync), so a reader sees the
//! old one or the new one, never a torn one. Its `inputHash` is the identity of the loop's input:
//! a write with another `inputHash` than the stored one is refused. `pendingCycleRunId` is the
//! crash-recovery marker: a write that leaves it out keeps the stored one, and only an explicit
//! `null` clears it.
//!
//! Within a process, the writes of one manifest take turns: a mutex per manifest file, kept in a
//! process-wide map keyed by the file's resolved path (so two worlds opened on one data directory
//! share it), covers the whole read → check `inputHash` → merge `pendingCycleRunId` → publish.
//! Every write has a tmp file of its own (pid + counter), so overlapping writes never mix bytes.
//! Across processes, writers are expected to hold the outer-loop lock (`acquireOuterLoopLock`);
//! two processes writing without it may race the merge (the later one's `pendingCycleRunId`
//! wins), but each still publishes a whole file, and the `inputHash` check holds even then: the
//! first manifest is linked into place, so only one of two first writes can place it.
//!
//! A stored manifest that is not a JSON object naming the requested `outerLoopId` and an
//! `inputHash` is corrupt ([`WorldError::RuntimeIntegrity`]); a write whose manifest does not have
//! the shape of seed 001 (`OuterLoopManifest` in `world.ts`) is refused with
//! [`WorldError::Validation`]. Fields the shape does not name are allowed and kept.

use crate::core::canonical;
use crate::core::durable::{sync_dir, TmpFile};
use crate::core::error::{Result, WorldError};
use crate::core::events::known::is_count;
use crate::core::files::{self, Unreadable};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

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

/// The outer-loop manifests of a world.
pub enum OuterLoops {
    /// Files in `dir`, the resolved `<dataDir>/outer-loops`.
    Local { dir: PathBuf },
    /// Canonical JSON texts by id; the map's lock also serializes the writes.
    Memory(Mutex<HashMap<String, String>>),
}

impl OuterLoops {
    /// The manifests of the local world at `data_dir`.
    pub fn local(data_dir: &Path) -> Result<OuterLoops> {
        let dir = data_dir.join("outer-loops");
        crate::core::durable::create_dir_synced(&dir, "the outer-loops directory")?;
        // Resolved, so every handle on this directory keys its write turns by the same paths.
        let dir = dir
            .canonicalize()
            .map_err(|e| WorldError::io("resolving the outer-loops directory", Some(dir.clone()), e))?;
        // A write cut short by a crash leaves its tmp file; its process is gone.
        crate::core::durable::remove_stale_tmp(&dir);
        Ok(OuterLoops::Local { dir })
    }

    /// The manifests of a world opened for reading only (at its resolved `data_dir`): nothing is
    /// created or cleaned up.
    pub fn local_read_only(data_dir: &Path) -> OuterLoops {
        OuterLoops::Local {
            dir: data_dir.join("outer-loops"),
        }
    }

    /// Manifests kept in memory.
    pub fn memory() -> OuterLoops {
        OuterLoops::Memory(Mutex::new(HashMap::new()))
    }

    /// The stored manifest's canonical JSON, if there is one.
    pub fn read(&self, id: &str) -> Result<Option<String>> {
        check_outer_loop_id(id)?;
        match self {
            OuterLoops::Memory(map) => Ok(unpoisoned(map).get(id).cloned()),
            OuterLoops::Local { dir } => {
                let stored = read_file(&dir.join(format!("{id}.json")), id)?;
                Ok(stored.map(|m| canonical::to_string(&Value::Object(m))))
            }
        }
    }

    /// Write a manifest (JSON text of an object with the shape of seed 001).
    pub fn write(&self, manifest_json: &str) -> Result<()> {
        let manifest = match canonical::parse(manifest_json) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Err(WorldError::validation("manifest", "must be an object")),
            Err(e) => return Err(WorldError::validation("manifest", e.to_string())),
        };
        let id = validate(&manifest)?;
        match self {
            OuterLoops::Memory(map) => {
                let mut map = unpoisoned(map);
                // Only validated manifests are stored, so a stored text is an object (parsed as
                // deep as it was accepted: serde_json's own limit would drop a deep one).
                let stored = match map.get(&id).map(|t| canonical::parse(t)) {
                    Some(Ok(Value::Object(m))) => Some(m),
                    None => None,
                    Some(_) => {
                        return Err(WorldError::RuntimeIntegrity {
                            reason: format!("the stored outer-loop manifest {id} does not parse"),
                        })
                    }
                };
                let text = merge(&id, manifest, stored.as_ref())?;
                map.insert(id, text);
                Ok(())
            }
            OuterLoops::Local { dir } => {
                let path = dir.join(format!("{id}.json"));
                let turn = write_turn(&path);
                let _turn = unpoisoned(&turn);
                // The first manifest is linked into place, which fails where one exists: of two
                // processes writing it at once, the second is then checked against the first's
                // `inputHash` (both used to pass, and one's manifest was silently replaced).
                // Later writes replace one with their own `inputHash`, so none changes it.
                for _ in 0..ROUNDS {
                    let stored = read_file(&path, &id)?;
                    let text = merge(&id, manifest.clone(), stored.as_ref())?;
                    before_publishing(&path);
                    // Held (locked) until the end of this round, after the rename or link.
                    let tmp = TmpFile::write_synced(dir, &format!("{id}.json"), text.as_bytes())?;
                    let published = match stored {
                        Some(_) => fs::rename(&tmp.path, &path),
                        None => fs::hard_link(&tmp.path, &path),
                    };
                    let _ = fs::remove_file(&tmp.path);
                    match published {
                        Ok(()) => return sync_dir(dir),
                        Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                        Err(e) => return Err(WorldError::io("publishing an outer-loop manifest", Some(path), e)),
                    }
                }
                Err(WorldError::io(
                    "publishing an outer-loop manifest",
                    Some(path),
                    std::io::Error::other("it kept appearing and vanishing while this write was checked"),
                ))
            }
        }
    }
}

/// How many times a write reads the stored manifest again because another process published the
/// first one meanwhile (once is all it takes unless manifests are also deleted).
const ROUNDS: usize = 8;

#[cfg(test)]
thread_local! {
    /// What a test does, as another process would, between a write's check and its publishing.
    static BEFORE_PUBLISHING: std::cell::RefCell<Option<Box<dyn FnMut(&Path)>>> = const { std::cell::RefCell::new(None) };
}

#[cfg(test)]
fn before_publishing(path: &Path) {
    BEFORE_PUBLISHING.with(|h| {
        if let Some(f) = h.borrow_mut().as_mut() {
            f(path)
        }
    });
}

#[cfg(not(test))]
#[inline(always)]
fn before_publishing(_path: &Path) {}

/// Lock a mutex, ignoring poisoning: what it guards stays consistent when a holder panics.
fn unpoisoned<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The mutex that serializes this process's writes of the manifest at `path` (a resolved path).
/// Every handle on the file gets the same one while any write holds it; entries no write holds
/// any more are dropped when a new one is added, so the map stays as small as the writes in flight.
fn write_turn(path: &Path) -> Arc<Mutex<()>> {
    static TURNS: OnceLock<Mutex<HashMap<PathBuf, Weak<Mutex<()>>>>> = OnceLock::new();
    let mut turns = unpoisoned(TURNS.get_or_init(Default::default));
    if let Some(turn) = turns.get(path).and_then(Weak::upgrade) {
        return turn;
    }
    turns.retain(|_, t| t.strong_count() > 0);
    let turn = Arc::new(Mutex::new(()));
    turns.insert(path.to_path_buf(), Arc::downgrade(&turn));
    turn
}

/// The manifest stored at `path`, if there is one, checked to be a JSON object that names `id`
/// and an `inputHash`; anything else is corrupt.
fn read_file(path: &Path, id: &str) -> Result<Option<Map<String, Value>>> {
    let corrupt = |what: String| WorldError::RuntimeIntegrity {
        reason: format!("outer-loop manifest {} {what}", path.display()),
    };
    let bytes = match files::read_small(path, MANIFEST_MAX as u64) {
        Ok(bytes) => bytes,
        Err(Unreadable::Missing) => return Ok(None),
        Err(Unreadable::Io(e)) => {
            return Err(WorldError::io(
                "reading an outer-loop manifest",
                Some(path.to_path_buf()),
                e,
            ))
        }
        Err(other) => {
            return Err(WorldError::RuntimeIntegrity {
                reason: format!("outer-loop manifest {}", other.describe(path)),
            })
        }
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
    Ok(Some(manifest))
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

/// Check a manifest's shape (seed 001; `OuterLoopManifest` in `world.ts`) and return its id.
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
        if !(v.is_null() || v.as_str().is_some_and(|s| crate::core::ids::check_run_id(s).is_ok())) {
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
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Barrier;
    use std::thread;

    /// Another process publishes the first manifest between this write's check and its publishing.
    #[test]
    fn a_first_manifest_written_by_two_processes_at_once_is_checked_against_the_one_that_won() {
        let dir = tempfile::tempdir().unwrap();
        let loops = OuterLoops::local(dir.path()).unwrap();
        let meanwhile = |theirs: &'static str| {
            let mut once = Some(theirs);
            BEFORE_PUBLISHING.with(|h| {
                *h.borrow_mut() = Some(Box::new(move |path: &Path| {
                    if let Some(text) = once.take() {
                        fs::write(path, text).unwrap();
                    }
                }))
            });
        };
        meanwhile(r#"{"inputHash":"sha256:b","outerLoopId":"ol_race"}"#);
        let err = loops
            .write(r#"{"outerLoopId":"ol_race","inputHash":"sha256:a","pendingCycleRunId":"run_a"}"#)
            .unwrap_err();
        assert_eq!(err.code(), "OUTER_LOOP_INPUT_MISMATCH");
        let v: Value = serde_json::from_str(&loops.read("ol_race").unwrap().unwrap()).unwrap();
        assert_eq!(v["inputHash"], "sha256:b");

        // With the same inputHash, the write goes on over the other's, keeping its pending run.
        meanwhile(r#"{"inputHash":"sha256:c","outerLoopId":"ol_same","pendingCycleRunId":"run_other"}"#);
        loops
            .write(r#"{"outerLoopId":"ol_same","inputHash":"sha256:c","maxCycles":3}"#)
            .unwrap();
        BEFORE_PUBLISHING.with(|h| *h.borrow_mut() = None);
        let v: Value = serde_json::from_str(&loops.read("ol_same").unwrap().unwrap()).unwrap();
        assert_eq!(v["maxCycles"], 3);
        assert_eq!(v["pendingCycleRunId"], "run_other");
        let left: Vec<_> = fs::read_dir(dir.path().join("outer-loops"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left.len(), 2, "{left:?}");
    }

    /// What is at a manifest's path but is no file is named, and a FIFO does not hang the read.
    #[test]
    fn a_manifest_path_holding_no_file_is_corrupt_and_said_so() {
        let dir = tempfile::tempdir().unwrap();
        let loops = OuterLoops::local(dir.path()).unwrap();
        let at = |id: &str| dir.path().join("outer-loops").join(format!("{id}.json"));
        fs::create_dir(at("ol_dir")).unwrap();
        let fifo = std::ffi::CString::new(at("ol_fifo").to_str().unwrap()).unwrap();
        // SAFETY: a valid C string naming a path in a temporary directory.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        for (id, what) in [("ol_dir", "a directory"), ("ol_fifo", "a FIFO")] {
            let err = loops.read(id).unwrap_err();
            assert_eq!(err.code(), "RUNTIME_INTEGRITY");
            assert!(
                err.to_string().ends_with(&format!("{id}.json is {what}, not a file")),
                "{err}"
            );
            let err = loops
                .write(&format!(r#"{{"outerLoopId":"{id}","inputHash":"sha256:a"}}"#))
                .unwrap_err();
            assert_eq!(err.code(), "RUNTIME_INTEGRITY");
        }
    }

    #[test]
    fn a_manifest_larger_than_any_written_is_refused_and_never_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let loops = OuterLoops::local(dir.path()).unwrap();
        // A sparse terabyte at a manifest's path: read whole, it took the process's memory.
        let path = dir.path().join("outer-loops/ol_huge.json");
        fs::File::create(&path).unwrap().set_len(1 << 40).unwrap();
        let err = loops.read("ol_huge").unwrap_err();
        assert_eq!(err.code(), "RUNTIME_INTEGRITY");
        assert!(
            err.to_string().contains("ol_huge.json holds 1099511627776 bytes"),
            "{err}"
        );
        // One byte over the limit, in canonical JSON, is refused in both stores and nothing is
        // kept; at the limit it is stored and read back.
        let head = r#"{"goal":{"description":""},"inputHash":"sha256:a","outerLoopId":"ol_big"}"#;
        let over = head.replacen(
            r#":"""#,
            &format!(r#":"{}""#, "x".repeat(MANIFEST_MAX + 1 - head.len())),
            1,
        );
        assert_eq!(over.len(), MANIFEST_MAX + 1);
        let at_limit = over.replacen('x', "", 1);
        for loops in [OuterLoops::local(dir.path()).unwrap(), OuterLoops::memory()] {
            let err = loops.write(&over).unwrap_err();
            assert_eq!(err.code(), "EVENT_VALIDATION");
            assert!(
                err.to_string().contains("a manifest holds at most 268435456 (256 MiB)"),
                "{err}"
            );
            assert_eq!(loops.read("ol_big").unwrap(), None);
            loops.write(&at_limit).unwrap();
            assert_eq!(loops.read("ol_big").unwrap().unwrap(), at_limit);
        }
    }

    #[test]
    fn input_hash_is_the_loops_identity_and_pending_run_is_kept_until_cleared() {
        let dir = tempfile::tempdir().unwrap();
        for loops in [OuterLoops::local(dir.path()).unwrap(), OuterLoops::memory()] {
            assert_eq!(loops.read("ol_1").unwrap(), None);
            loops
                .write(r#"{"outerLoopId":"ol_1","inputHash":"sha256:a","maxCycles":5,"cycles":[],"pendingCycleRunId":"run_c1"}"#)
                .unwrap();
            loops
                .write(
                    r#"{"outerLoopId":"ol_1","inputHash":"sha256:a","maxCycles":5,"cycles":[{"cycleNumber":1,"runId":"run_c1","status":"completed"}]}"#,
                )
                .unwrap();
            let v: Value = serde_json::from_str(&loops.read("ol_1").unwrap().unwrap()).unwrap();
            assert_eq!(v["pendingCycleRunId"], "run_c1");
            assert_eq!(v["cycles"][0]["cycleNumber"], 1);
            loops
                .write(r#"{"outerLoopId":"ol_1","inputHash":"sha256:a","pendingCycleRunId":null}"#)
                .unwrap();
            let v: Value = serde_json::from_str(&loops.read("ol_1").unwrap().unwrap()).unwrap();
            assert!(v.get("pendingCycleRunId").is_none());
            let err = loops
                .write(r#"{"outerLoopId":"ol_1","inputHash":"sha256:b"}"#)
                .unwrap_err();
            assert_eq!(err.code(), "OUTER_LOOP_INPUT_MISMATCH");
            assert_eq!(
                loops
                    .write(r#"{"outerLoopId":"../x","inputHash":"h"}"#)
                    .unwrap_err()
                    .code(),
                "WORLD_PATH"
            );
            assert_eq!(
                loops.write(r#"{"outerLoopId":"ol_2"}"#).unwrap_err().code(),
                "EVENT_VALIDATION"
            );
        }
    }

    /// A manifest nested deeper than serde_json's default limit keeps its checks in both stores
    /// (the memory store re-read it with that limit, and took an unreadable one for none).
    #[test]
    fn a_deep_manifest_keeps_its_input_hash_and_pending_run() {
        let dir = tempfile::tempdir().unwrap();
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        for loops in [OuterLoops::local(dir.path()).unwrap(), OuterLoops::memory()] {
            loops
                .write(&format!(
                    r#"{{"outerLoopId":"ol_d","inputHash":"sha256:a","cycles":[{{"cycleNumber":1,"runId":"run_c1","status":"completed","output":{deep}}}],"pendingCycleRunId":"run_c1"}}"#
                ))
                .unwrap();
            let err = loops
                .write(r#"{"outerLoopId":"ol_d","inputHash":"sha256:b"}"#)
                .unwrap_err();
            assert_eq!(err.code(), "OUTER_LOOP_INPUT_MISMATCH");
            loops.write(r#"{"outerLoopId":"ol_d","inputHash":"sha256:a"}"#).unwrap();
            let v = canonical::parse(&loops.read("ol_d").unwrap().unwrap()).unwrap();
            assert_eq!(v["pendingCycleRunId"], "run_c1");
        }
    }

    /// The local manifests of `data` plus a second handle on them through a symlink (two worlds of
    /// one process on one data directory), and an in-memory store shared by two handles.
    fn store_pairs(root: &Path) -> Vec<(Arc<OuterLoops>, Arc<OuterLoops>, Option<PathBuf>)> {
        let data = root.join("data");
        fs::create_dir_all(&data).unwrap();
        let link = root.join("link");
        std::os::unix::fs::symlink(&data, &link).unwrap();
        let memory = Arc::new(OuterLoops::memory());
        vec![
            (
                Arc::new(OuterLoops::local(&data).unwrap()),
                Arc::new(OuterLoops::local(&link).unwrap()),
                Some(data.join("outer-loops")),
            ),
            (memory.clone(), memory, None),
        ]
    }

    #[test]
    fn overlapping_writes_of_one_manifest_are_serialized_and_never_torn() {
        const THREADS: usize = 8;
        const WRITES: usize = 12;
        const ROUNDS: usize = 6;
        let root = tempfile::tempdir().unwrap();
        for (a, b, dir) in store_pairs(root.path()) {
            for round in 0..ROUNDS {
                let id = format!("ol_race_{round}");
                let start = Barrier::new(THREADS + 1);
                let done = AtomicBool::new(false);
                // Per thread, in order: (manifest written, what the write returned).
                let outcomes: Vec<Vec<(Value, Result<()>)>> = thread::scope(|s| {
                    let reader = s.spawn(|| -> Result<()> {
                        start.wait();
                        // Every read while the writes overlap parses: no torn file is ever published.
                        while !done.load(Ordering::Relaxed) {
                            a.read(&id)?;
                        }
                        Ok(())
                    });
                    let writers: Vec<_> = (0..THREADS)
                        .map(|t| {
                            let (loops, id, start) = (if t % 2 == 0 { &a } else { &b }, &id, &start);
                            s.spawn(move || {
                                start.wait();
                                (0..WRITES)
                                    .map(|i| {
                                        // Alternate the input between the two handles and over time.
                                        let hash = if (t + i) % 2 == 0 { "sha256:a" } else { "sha256:b" };
                                        let run_id = format!("run_{t}_{i}");
                                        let mut m = serde_json::json!({
                                            "outerLoopId": id,
                                            "inputHash": hash,
                                            "cycles": [{"cycleNumber": i + 1, "runId": run_id, "status": "completed"}],
                                            "pad": "x".repeat(16 * 1024),
                                        });
                                        // Every third write sets a pending run; the others keep it.
                                        if i % 3 == 0 {
                                            m["pendingCycleRunId"] = run_id.into();
                                        }
                                        let r = loops.write(&m.to_string());
                                        (m, r)
                                    })
                                    .collect::<Vec<_>>()
                            })
                        })
                        .collect();
                    let outcomes = writers.into_iter().map(|w| w.join().unwrap()).collect();
                    done.store(true, Ordering::Relaxed);
                    reader.join().unwrap().expect("a read while writes overlap");
                    outcomes
                });

                // Each write resolved or was refused for its input, nothing else.
                for (_, r) in outcomes.iter().flatten() {
                    if let Err(e) = r {
                        assert_eq!(e.code(), "OUTER_LOOP_INPUT_MISMATCH", "{e}");
                    }
                }
                // The first write stored its inputHash; exactly the writes carrying it resolved.
                let mut stored: Map<String, Value> = serde_json::from_str(&a.read(&id).unwrap().unwrap()).unwrap();
                let first_hash = stored["inputHash"].clone();
                for (m, r) in outcomes.iter().flatten() {
                    let what = (&m["inputHash"], &m["cycles"][0]["runId"]);
                    assert_eq!(
                        r.is_ok(),
                        m["inputHash"] == first_hash,
                        "round {round}: {what:?} gave {r:?}"
                    );
                }
                // The stored manifest is one thread's last resolved write (a thread's writes are in
                // order), carrying a pending run a resolved write set: once one is set, later writes
                // that leave it out keep it, so it can only be lost by a merge that raced.
                let pending = stored.remove("pendingCycleRunId");
                let resolved = || outcomes.iter().flatten().filter(|(_, r)| r.is_ok()).map(|(m, _)| m);
                let set: Vec<&Value> = resolved().filter_map(|m| m.get("pendingCycleRunId")).collect();
                assert_eq!(
                    pending.is_some(),
                    !set.is_empty(),
                    "round {round}: pendingCycleRunId {pending:?}"
                );
                assert!(
                    pending.as_ref().is_none_or(|p| set.contains(&p)),
                    "round {round}: {pending:?}"
                );
                let stored = Value::Object(stored);
                let is_stored = |m: &Value| {
                    let mut m = m.clone();
                    m.as_object_mut().unwrap().remove("pendingCycleRunId");
                    m == stored
                };
                let last_writes = outcomes.iter().filter_map(|w| w.iter().rev().find(|(_, r)| r.is_ok()));
                assert!(
                    last_writes.map(|(m, _)| m).any(is_stored),
                    "round {round}: the stored manifest is no thread's last resolved write"
                );
                if let Some(dir) = &dir {
                    let tmps = fs::read_dir(dir)
                        .unwrap()
                        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".tmp"))
                        .count();
                    assert_eq!(tmps, 0, "temporary files left behind");
                }
            }
        }
    }

    #[test]
    fn opening_removes_the_tmp_files_of_writers_that_are_gone_and_keeps_live_ones() {
        let data = tempfile::tempdir().unwrap();
        let dir = data.path().join("outer-loops");
        std::fs::create_dir_all(&dir).unwrap();
        let me = std::process::id();
        let file = |name: &str| {
            let path = dir.join(name);
            std::fs::write(&path, b"{").unwrap();
            path
        };
        // Named by an earlier version (<stem>.<pid>.<n>-<nanos>.tmp): judged by the pid.
        let old_dead = file("ol_1.json.2147483646.0-1.tmp");
        let old_live = file(&format!("ol_1.json.{me}.0-2.tmp"));
        // Named by this one: judged by the lock its writer holds, whatever the pid says. A writer
        // in another pid namespace has a pid that means nothing here (it used to lose its file,
        // and its write failed); a dead predecessor may have had this process's pid.
        let held_elsewhere = file("ol_1.json.2147483646.0-3-flock.tmp");
        let writer = std::fs::File::open(&held_elsewhere).unwrap();
        assert_eq!(crate::core::process::lock_for_life(&writer), Some(true));
        let predecessor = file(&format!("ol_1.json.{me}.0-4-flock.tmp"));
        // Where an earlier version looks for the pid in a name, it finds this one's: it judges
        // these files by pid as it judges its own (it used to find none, and removed live ones).
        let name = crate::core::durable::TmpFile::write_synced(&dir, "ol_9.json", b"{}").unwrap();
        let name = name.path.file_name().unwrap().to_str().unwrap().to_string();
        let stem = name.strip_suffix(".tmp").unwrap();
        assert_eq!(stem.rsplit('.').nth(1), Some(me.to_string().as_str()), "{name}");
        std::fs::remove_file(dir.join(&name)).unwrap();
        OuterLoops::local(data.path()).unwrap();
        assert!(!old_dead.exists(), "a crashed writer's tmp file is removed");
        assert!(old_live.exists(), "a live writer's is not");
        assert!(held_elsewhere.exists(), "a locked one is not, whatever its pid");
        assert!(!predecessor.exists(), "an unlocked one is, whatever its pid");
        // A manifest written now takes no leftover's lock and leaves no file behind.
        let loops = OuterLoops::local(data.path()).unwrap();
        loops.write(r#"{"outerLoopId":"ol_1","inputHash":"h"}"#).unwrap();
        let mut left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        let mut want = [
            "ol_1.json".to_string(),
            "ol_1.json.2147483646.0-3-flock.tmp".to_string(),
            format!("ol_1.json.{me}.0-2.tmp"),
        ];
        want.sort();
        assert_eq!(left, want);
    }

    #[test]
    fn a_manifest_an_earlier_version_stored_with_an_empty_input_hash_stays_readable_and_writable() {
        let data = tempfile::tempdir().unwrap();
        let loops = OuterLoops::local(data.path()).unwrap();
        let path = data.path().join("outer-loops/ol_e.json");
        fs::write(&path, r#"{"inputHash":"","outerLoopId":"ol_e"}"#).unwrap();
        assert!(loops.read("ol_e").unwrap().is_some());
        loops
            .write(r#"{"outerLoopId":"ol_e","inputHash":"","maxCycles":2}"#)
            .unwrap();
        assert_eq!(
            loops
                .write(r#"{"outerLoopId":"ol_e","inputHash":"h"}"#)
                .unwrap_err()
                .code(),
            "OUTER_LOOP_INPUT_MISMATCH"
        );
    }

    #[test]
    fn a_stored_manifest_that_is_not_the_requested_loops_is_corrupt() {
        let root = tempfile::tempdir().unwrap();
        let loops = OuterLoops::local(root.path()).unwrap();
        let path = root.path().join("outer-loops").join("ol_1.json");
        for (text, why) in [
            ("[]", "not a JSON object"),
            ("\"ol_1\"", "not a JSON object"),
            (r#"{"inputHash":"h"}"#, "outerLoopId"),
            (r#"{"outerLoopId":"ol_2","inputHash":"h"}"#, "outerLoopId"),
            (r#"{"outerLoopId":1,"inputHash":"h"}"#, "outerLoopId"),
            (r#"{"outerLoopId":"ol_1"}"#, "inputHash"),
            (r#"{"outerLoopId":"ol_1","inputHash":7}"#, "inputHash"),
            (r#"{"outerLoopId":"ol_1","#, "not JSON"),
            (
                "{\"outerLoopId\":\"ol_1\",\"inputHash\":\"h\",\"x\":\"\u{FFFD}\"}",
                "not UTF-8",
            ),
        ] {
            // The last case's replacement character stands for a byte that is not UTF-8.
            let bytes = text.replace('\u{FFFD}', "\u{1}").into_bytes();
            let bytes: Vec<u8> = bytes.into_iter().map(|b| if b == 1 { 0xff } else { b }).collect();
            fs::write(&path, &bytes).unwrap();
            let err = loops.read("ol_1").unwrap_err();
            assert_eq!(err.code(), "RUNTIME_INTEGRITY", "{text}: {err}");
            let msg = err.to_string();
            assert!(msg.contains("ol_1.json") && msg.contains(why), "{text}: {msg}");
            // A write does not paper over it either.
            let err = loops.write(r#"{"outerLoopId":"ol_1","inputHash":"h"}"#).unwrap_err();
            assert_eq!(err.code(), "RUNTIME_INTEGRITY", "{text}: {err}");
            assert_eq!(fs::read(&path).unwrap(), bytes);
        }
        fs::write(&path, r#"{"outerLoopId":"ol_1","inputHash":"h","extra":[1]}"#).unwrap();
        assert_eq!(
            loops.read("ol_1").unwrap().unwrap(),
            r#"{"extra":[1],"inputHash":"h","outerLoopId":"ol_1"}"#
        );
    }

    #[test]
    fn writes_are_validated_against_the_manifest_shape() {
        let ok = r#"{"outerLoopId":"ol_v","inputHash":"sha256:a","maxCycles":0,"goal":{"description":"d","x":1},
            "cycles":[{"cycleNumber":1,"runId":"run_1","status":"completed","workflowVersionId":"wv_1","output":{},"x":1}],
            "pendingCycleRunId":null,"result":{"kind":"done","finalOutput":null,"x":1},"extra":true}"#;
        let base: Map<String, Value> = serde_json::from_str(ok).unwrap();
        let cycle = serde_json::json!({"cycleNumber": 1, "runId": "run_1", "status": "completed"});
        let bad: Vec<(&str, Value, &str)> = vec![
            ("outerLoopId", Value::from(5), "manifest.outerLoopId"),
            ("inputHash", Value::Null, "manifest.inputHash"),
            ("maxCycles", Value::from(-1), "manifest.maxCycles"),
            ("maxCycles", Value::from(1.5), "manifest.maxCycles"),
            ("maxCycles", Value::from(9_007_199_254_740_992u64), "manifest.maxCycles"),
            ("maxCycles", Value::from("5"), "manifest.maxCycles"),
            ("maxCycles", Value::Null, "manifest.maxCycles"),
            ("goal", Value::from("find a date"), "manifest.goal"),
            (
                "goal",
                serde_json::json!({"description": 1}),
                "manifest.goal.description",
            ),
            ("cycles", Value::from("no"), "manifest.cycles"),
            ("cycles", serde_json::json!([cycle, 7]), "manifest.cycles[1]"),
            (
                "cycles",
                serde_json::json!([cycle, cycle, {"cycleNumber": 3, "status": "completed"}]),
                "manifest.cycles[2].runId",
            ),
            (
                "cycles",
                serde_json::json!([{"cycleNumber": 0, "runId": "run_1", "status": "s"}]),
                "manifest.cycles[0].cycleNumber",
            ),
            (
                "cycles",
                serde_json::json!([{"cycleNumber": 1.5, "runId": "run_1", "status": "s"}]),
                "manifest.cycles[0].cycleNumber",
            ),
            (
                "cycles",
                serde_json::json!([{"cycleNumber": "1", "runId": "run_1", "status": "s"}]),
                "manifest.cycles[0].cycleNumber",
            ),
            (
                "cycles",
                serde_json::json!([{"runId": "run_1", "status": "s"}]),
                "manifest.cycles[0].cycleNumber",
            ),
            (
                "cycles",
                serde_json::json!([{"cycleNumber": 1, "runId": 1, "status": "s"}]),
                "manifest.cycles[0].runId",
            ),
            (
                "cycles",
                serde_json::json!([{"cycleNumber": 1, "runId": "run_1"}]),
                "manifest.cycles[0].status",
            ),
            (
                "cycles",
                serde_json::json!([{"cycleNumber": 1, "runId": "run_1", "status": "s", "workflowVersionId": 2}]),
                "manifest.cycles[0].workflowVersionId",
            ),
            ("pendingCycleRunId", Value::from(5), "manifest.pendingCycleRunId"),
            ("result", serde_json::json!({"kind": "maybe"}), "manifest.result.kind"),
            ("result", serde_json::json!({"finalOutput": 1}), "manifest.result.kind"),
            ("result", Value::from("done"), "manifest.result"),
            ("result", Value::Null, "manifest.result"),
        ];
        let root = tempfile::tempdir().unwrap();
        for loops in [OuterLoops::local(root.path()).unwrap(), OuterLoops::memory()] {
            for (field, value, want) in &bad {
                let mut m = base.clone();
                m.insert(field.to_string(), value.clone());
                let err = loops.write(&Value::Object(m).to_string()).unwrap_err();
                match &err {
                    WorldError::Validation { path, .. } => assert_eq!(path, want, "{field}: {value}"),
                    other => panic!("{field}: {value}: {other}"),
                }
                assert_eq!(loops.read("ol_v").unwrap(), None, "{field}: {value} was stored");
            }
            // Every optional field may be left out, and extra fields are kept.
            loops.write(r#"{"outerLoopId":"ol_v","inputHash":"sha256:a"}"#).unwrap();
            loops.write(ok).unwrap();
            let stored: Value = serde_json::from_str(&loops.read("ol_v").unwrap().unwrap()).unwrap();
            assert_eq!(stored["extra"], true);
            assert_eq!(stored["cycles"][0]["x"], 1);
        }
    }
}
