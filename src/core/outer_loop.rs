//! Outer-loop manifests: `<dataDir>/outer-loops/<outerLoopId>.json`, the cycle-level record.
//!
//! A manifest is written whole by tmp + fsync + rename (+ directory fsync), so a reader sees the
//! old one or the new one, never a torn one. Its `inputHash` is the identity of the loop's input:
//! a write with another `inputHash` than the stored one is refused. `pendingCycleRunId` is the
//! crash-recovery marker: a write that leaves it out keeps the stored one, and only an explicit
//! `null` clears it.

use crate::core::artifacts::{sync_dir, write_synced};
use crate::core::canonical;
use crate::core::error::{Result, WorldError};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

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
    Local { dir: PathBuf },
    Memory(Mutex<HashMap<String, String>>),
}

impl OuterLoops {
    /// The manifests of the local world at `data_dir`.
    pub fn local(data_dir: &Path) -> Result<OuterLoops> {
        let dir = data_dir.join("outer-loops");
        fs::create_dir_all(&dir)
            .map_err(|e| WorldError::io("creating the outer-loops directory", Some(dir.clone()), e))?;
        Ok(OuterLoops::Local { dir })
    }

    /// Manifests kept in memory.
    pub fn memory() -> OuterLoops {
        OuterLoops::Memory(Mutex::new(HashMap::new()))
    }

    /// The stored manifest's canonical JSON, if there is one.
    pub fn read(&self, id: &str) -> Result<Option<String>> {
        check_outer_loop_id(id)?;
        match self {
            OuterLoops::Memory(map) => Ok(map.lock().unwrap_or_else(|p| p.into_inner()).get(id).cloned()),
            OuterLoops::Local { dir } => {
                let path = dir.join(format!("{id}.json"));
                match fs::read_to_string(&path) {
                    Ok(text) => {
                        let v = canonical::parse(&text).map_err(|e| WorldError::RuntimeIntegrity {
                            reason: format!("outer-loop manifest {} {e}", path.display()),
                        })?;
                        Ok(Some(canonical::to_string(&v)))
                    }
                    Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(WorldError::io("reading an outer-loop manifest", Some(path), e)),
                }
            }
        }
    }

    /// Write a manifest (JSON text of an object with `outerLoopId` and `inputHash`).
    pub fn write(&self, manifest_json: &str) -> Result<()> {
        let mut manifest = match canonical::parse(manifest_json) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Err(WorldError::validation("manifest", "must be an object")),
            Err(e) => return Err(WorldError::validation("manifest", e.to_string())),
        };
        let id = match manifest.get("outerLoopId") {
            Some(Value::String(s)) => s.clone(),
            _ => return Err(WorldError::validation("manifest.outerLoopId", "must be a string")),
        };
        check_outer_loop_id(&id)?;
        let Some(Value::String(input_hash)) = manifest.get("inputHash").cloned() else {
            return Err(WorldError::validation("manifest.inputHash", "must be a string"));
        };
        if let Some(v) = manifest.get("pendingCycleRunId") {
            if !(v.is_null() || v.as_str().is_some_and(|s| crate::core::ids::check_run_id(s).is_ok())) {
                return Err(WorldError::validation(
                    "manifest.pendingCycleRunId",
                    "must be a run id or null",
                ));
            }
        }
        let stored = self.read(&id)?;
        if let Some(stored) = &stored {
            let stored: Map<String, Value> = serde_json::from_str(stored).unwrap_or_default();
            let stored_hash = stored.get("inputHash").and_then(Value::as_str).unwrap_or("");
            if stored_hash != input_hash {
                return Err(WorldError::OuterLoopInputMismatch {
                    outer_loop_id: id,
                    stored: stored_hash.to_string(),
                    given: input_hash,
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
        let text = canonical::to_string(&Value::Object(manifest));
        match self {
            OuterLoops::Memory(map) => {
                map.lock().unwrap_or_else(|p| p.into_inner()).insert(id, text);
                Ok(())
            }
            OuterLoops::Local { dir } => {
                let path = dir.join(format!("{id}.json"));
                let tmp = dir.join(format!("{id}.json.{}.tmp", std::process::id()));
                write_synced(&tmp, text.as_bytes())?;
                fs::rename(&tmp, &path)
                    .map_err(|e| WorldError::io("publishing an outer-loop manifest", Some(path), e))?;
                sync_dir(dir)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_hash_is_the_loops_identity_and_pending_run_is_kept_until_cleared() {
        let dir = tempfile::tempdir().unwrap();
        for loops in [OuterLoops::local(dir.path()).unwrap(), OuterLoops::memory()] {
            assert_eq!(loops.read("ol_1").unwrap(), None);
            loops
                .write(r#"{"outerLoopId":"ol_1","inputHash":"sha256:a","maxCycles":5,"cycles":[],"pendingCycleRunId":"run_c1"}"#)
                .unwrap();
            loops
                .write(r#"{"outerLoopId":"ol_1","inputHash":"sha256:a","maxCycles":5,"cycles":[{"cycleNumber":1}]}"#)
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
}
