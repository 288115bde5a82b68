//! A world's artifacts, locks and outer-loop manifests.

use super::{spawn, World};
use crate::artifacts::{Data, Encoding, NewArtifact};
use crate::error::{Result, WorldError};
use crate::ids;
use crate::runtime::{Output, Pool, Ticket};

impl World {
    /// Publish an artifact; completes with its manifest's JSON.
    pub fn write_artifact(&self, ticket: Ticket, meta: NewArtifact, data: Data) -> Result<()> {
        self.ensure_open()?;
        self.ensure_writable("writing an artifact")?;
        let store = self.inner.artifacts.clone();
        self.run(ticket, move || {
            store.write(meta, data).map(|m| Output::Json(m.to_json()))
        })
    }

    /// Read and verify an artifact; completes with `[manifest JSON, payload]`, the payload as text
    /// for `json` and `utf8`, as bytes for `bytes`.
    pub fn read_artifact(&self, ticket: Ticket, reference: &str) -> Result<()> {
        let id = crate::artifacts::parse_ref(reference)?.to_string();
        let store = self.inner.artifacts.clone();
        self.run(ticket, move || {
            let (manifest, bytes) = store.read(&id)?;
            let payload = match manifest.encoding {
                Encoding::Bytes => Output::Bytes(bytes),
                Encoding::Json | Encoding::Utf8 => Output::Json(String::from_utf8(bytes.into_vec()).map_err(|_| {
                    WorldError::ArtifactManifestCorrupt {
                        artifact_id: id.clone(),
                        reason: "the blob of a text artifact is not UTF-8".into(),
                    }
                })?),
            };
            Ok(Output::List(vec![Output::Json(manifest.to_json()), payload]))
        })
    }

    /// Move up to `limit` of the artifacts this world stored before it had a bucket into the
    /// bucket; completes with `{ moved, bytes, left }`.
    pub fn move_artifacts(&self, ticket: Ticket, limit: u32) -> Result<()> {
        self.ensure_open()?;
        self.ensure_writable("moving artifacts")?;
        let store = self.inner.artifacts.clone();
        self.run(ticket, move || {
            let (moved, bytes, left) = store.move_in(limit.max(1) as usize)?;
            Ok(Output::Json(
                serde_json::json!({ "moved": moved, "bytes": bytes, "left": left }).to_string(),
            ))
        })
    }

    /// Take the lock of a run (`kind` `run`) or an outer loop (`outer-loop`) by its id, waiting up
    /// to `wait`; completes with `{name, token}`. Runs on a thread of its own, since it may sleep
    /// while it waits.
    pub fn acquire_lock(&self, ticket: Ticket, kind: &str, id: &str, wait: std::time::Duration) -> Result<()> {
        self.ensure_open()?;
        let name = match kind {
            "run" => ids::check_run_id(id).map(|()| crate::locks::run_lock_name(id))?,
            "outer-loop" => {
                crate::outer_loop::check_outer_loop_id(id).map(|()| crate::locks::outer_loop_lock_name(id))?
            }
            other => {
                return Err(WorldError::validation(
                    "kind",
                    format!("is not a kind of lock: {other}"),
                ))
            }
        };
        self.ensure_writable("taking a lock")?;
        let locks = self.inner.locks.clone();
        let completer = self.inner.completer.clone();
        spawn("little-world-lock", move || {
            let out = locks
                .acquire(&name, wait)
                .map(|h| Output::Json(serde_json::json!({"name": h.name, "token": h.token}).to_string()));
            completer.complete(vec![(ticket, out)]);
        })
    }

    /// Let go of a lock (see [`crate::locks::Locks::release`]). Also on a closed world: its close let go of its
    /// locks, and releasing one again is the no-op a double release is.
    pub fn release_lock(&self, ticket: Ticket, name: String, token: String) -> Result<()> {
        self.ensure_writable("releasing a lock")?;
        let locks = self.inner.locks.clone();
        Pool::global().run(self.inner.completer.clone(), ticket, move || {
            locks.release(&name, &token).map(|()| Output::Unit)
        })
    }

    /// Read an outer-loop manifest; completes with its JSON, or `null`.
    pub fn read_outer_loop(&self, ticket: Ticket, id: String) -> Result<()> {
        crate::outer_loop::check_outer_loop_id(&id)?;
        let loops = self.inner.outer_loops.clone();
        self.run(ticket, move || {
            Ok(Output::Json(loops.read(&id)?.unwrap_or_else(|| "null".into())))
        })
    }

    /// Write an outer-loop manifest.
    pub fn write_outer_loop(&self, ticket: Ticket, manifest_json: String) -> Result<()> {
        self.ensure_open()?;
        self.ensure_writable("writing an outer-loop manifest")?;
        let loops = self.inner.outer_loops.clone();
        self.run(ticket, move || loops.write(&manifest_json).map(|()| Output::Unit))
    }
}
