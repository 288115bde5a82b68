//! Content-addressed artifacts: the rules every world keeps, over a backend that stores them.
//!
//! An artifact's id is a hash of who made it and of its bytes ([`artifact_id`]), so writing the
//! same thing twice yields the same artifact. [`ArtifactStore`] checks what describes a new one,
//! turns its payload into the bytes its encoding stores, hashes them and takes this process's
//! turn at the id; an [`ArtifactBackend`] then publishes them, unless an intact artifact of that
//! id is stored already, and reads them back verified: the manifest against its own id
//! ([`check_manifest`]), the bytes' size and sha256 against the manifest ([`check_size`],
//! [`check_digest`]).
//! `local` keeps files in the data directory, `memory` a map.

pub mod bucket;
pub mod hashed_read;
pub mod local;
pub mod objects;
pub mod postgres;
pub mod r#virtual;

use crate::bytes::Bytes;
use crate::canonical;
use crate::clock;
use crate::error::{Result, WorldError};
use crate::ids;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::sync::{Condvar, Mutex};

/// The scheme of an artifact reference string.
pub const REF_PREFIX: &str = "artifact://";

/// How a payload is carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// Any JSON value, stored as its canonical JSON.
    Json,
    /// A string, stored as UTF-8.
    Utf8,
    /// Raw bytes.
    Bytes,
}

impl Encoding {
    /// Parse `json`, `utf8` or `bytes`.
    pub fn parse(s: &str) -> Result<Encoding> {
        match s {
            "json" => Ok(Encoding::Json),
            "utf8" => Ok(Encoding::Utf8),
            "bytes" => Ok(Encoding::Bytes),
            _ => Err(WorldError::validation(
                "input.encoding",
                "must be 'json', 'utf8' or 'bytes'",
            )),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Encoding::Json => "json",
            Encoding::Utf8 => "utf8",
            Encoding::Bytes => "bytes",
        }
    }
}

/// What describes an artifact, as stored in `<id>.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub artifact_id: String,
    pub artifact_ref: String,
    pub run_id: String,
    pub step_path: String,
    pub name: String,
    pub content_type: String,
    pub encoding: Encoding,
    pub sha256: String,
    pub size_bytes: u64,
    pub created_at: String,
}

impl Manifest {
    /// The manifest's canonical JSON.
    pub fn to_json(&self) -> String {
        canonical::to_string(&serde_json::to_value(self).expect("a manifest serializes"))
    }
}

/// Who makes an artifact, and how its payload is carried.
#[derive(Debug, Clone)]
pub struct NewArtifact {
    pub run_id: String,
    pub step_path: String,
    pub name: String,
    pub content_type: String,
    pub encoding: Encoding,
}

/// A payload on its way in.
pub enum Data {
    /// JSON text (for `json`, canonicalized before storing) or a string (for `utf8`).
    Text(String),
    /// Text that is already canonical JSON (for `json`), stored as is.
    Canonical(String),
    /// Raw bytes (for `bytes`).
    Bytes(Vec<u8>),
}

/// `art_` + the first 16 hex of sha256(JCS({runId, stepPath, name, contentType, encoding, payloadHash})).
pub fn artifact_id(meta: &NewArtifact, payload_hash: &str) -> String {
    let pre = serde_json::json!({
        "runId": meta.run_id,
        "stepPath": meta.step_path,
        "name": meta.name,
        "contentType": meta.content_type,
        "encoding": meta.encoding.as_str(),
        "payloadHash": payload_hash,
    });
    let digest = Sha256::digest(canonical::to_string(&pre).as_bytes());
    format!("art_{}", hex::encode(&digest[..8]))
}

/// The id in `artifact://art_…` or `art_…`.
pub fn parse_ref(s: &str) -> Result<&str> {
    let id = s.strip_prefix(REF_PREFIX).unwrap_or(s);
    if crate::ids::is_artifact_id(id) {
        Ok(id)
    } else {
        Err(WorldError::validation(
            "ref",
            "must be artifact://art_<16 hex> or art_<16 hex>",
        ))
    }
}

fn check_meta(meta: &NewArtifact) -> Result<()> {
    ids::check_run_id(&meta.run_id)?;
    for (field, value, may_be_empty) in [
        ("input.stepPath", &meta.step_path, true),
        ("input.name", &meta.name, false),
        ("input.contentType", &meta.content_type, false),
    ] {
        if (!may_be_empty && value.is_empty()) || value.len() > 1024 {
            let what = if may_be_empty { "a string" } else { "a non-empty string" };
            return Err(
                WorldError::validation(field, format!("must be {what} of at most 1024 bytes")).for_run(&meta.run_id),
            );
        }
    }
    Ok(())
}

/// The bytes to store for a payload, checked against its encoding.
fn payload_bytes(meta: &NewArtifact, data: Data) -> Result<Vec<u8>> {
    match (meta.encoding, data) {
        (Encoding::Json, Data::Text(text)) => canonical::canonicalize_text(&text)
            .map(String::into_bytes)
            .map_err(|e| WorldError::validation("input.payload", e.to_string()).for_run(&meta.run_id)),
        (Encoding::Json, Data::Canonical(c)) | (Encoding::Utf8, Data::Text(c)) => Ok(c.into_bytes()),
        (Encoding::Bytes, Data::Bytes(b)) => Ok(b),
        (encoding, _) => Err(WorldError::validation(
            "input.payload",
            match encoding {
                Encoding::Json => "must be a JSON value for encoding 'json'",
                Encoding::Utf8 => "must be a string for encoding 'utf8'",
                Encoding::Bytes => "must be a Uint8Array for encoding 'bytes'",
            },
        )
        .for_run(&meta.run_id)),
    }
}

/// Where a world keeps its artifacts. Called with this process's turn at the artifact's id held
/// (see [`ArtifactStore`]); a backend that several processes share settles their races itself.
pub trait ArtifactBackend: Send + Sync {
    /// Publish `bytes` as the artifact `manifest` describes (its id, size and sha256 are theirs),
    /// unless an intact artifact of that id is stored: then return the stored manifest. A damaged
    /// one is replaced by these bytes. A manifest is never visible without its whole blob.
    fn publish(&self, manifest: Manifest, bytes: &[u8]) -> Result<Manifest>;
    /// The artifact `id`, verified: its manifest against the id, its bytes against the manifest.
    /// `ArtifactNotFound` when there is none.
    fn read(&self, id: &str) -> Result<(Manifest, Bytes)>;
    /// Whether an artifact `id` is published (without reading it).
    fn exists(&self, id: &str) -> Result<bool>;
    /// The ids of every published artifact, in any order.
    fn list(&self) -> Result<Vec<String>>;
    /// The artifacts that runs of `runs` made (their manifests' `runId`): each with its run, id
    /// and size in bytes. One whose manifest does not read is left out (`little verify` reports
    /// it).
    fn owned_by(&self, runs: &[&str]) -> Result<Vec<(String, String, u64)>>;
    /// Remove the artifact `id`: its manifest first, so that no manifest is ever left without its
    /// bytes, then its bytes. A missing one is a no-op.
    fn remove(&self, id: &str) -> Result<()>;
    /// Bytes stored without a manifest, named as an artifact is: what a crash between writing an
    /// artifact's bytes and its manifest leaves in a store whose bytes are written apart
    /// ([`objects`]); none in the others.
    fn orphans(&self) -> Result<Vec<bucket::Listed>> {
        Ok(Vec::new())
    }
    /// Remove the orphan `id`, unless it has been given its manifest since it was listed.
    fn remove_orphan(&self, _id: &str) -> Result<()> {
        Ok(())
    }
    /// Artifacts kept in the store this backend was opened over, not in its own (see
    /// [`objects`]): those [`ArtifactBackend::move_in`] moves. None in the others.
    fn kept_elsewhere(&self) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
    /// Move artifact `id`, verified, from the store this backend was opened over into its own;
    /// its size, or `None` when it is not there.
    fn move_in(&self, _id: &str) -> Result<Option<u64>> {
        Ok(None)
    }
}

/// The artifacts of one world: the rules, over its backend.
pub struct ArtifactStore {
    backend: Box<dyn ArtifactBackend>,
    /// Artifacts being written by this process, so writers of one artifact take turns.
    writing: Mutex<HashSet<String>>,
    turn_over: Condvar,
}

impl ArtifactStore {
    /// The artifacts `backend` keeps.
    pub fn new(backend: impl ArtifactBackend + 'static) -> ArtifactStore {
        ArtifactStore {
            backend: Box::new(backend),
            writing: Mutex::new(HashSet::new()),
            turn_over: Condvar::new(),
        }
    }

    /// Store a payload; returns its manifest. Writing an artifact that exists verifies the stored
    /// blob and returns the stored manifest (a damaged one is replaced by the fresh bytes).
    pub fn write(&self, meta: NewArtifact, data: Data) -> Result<Manifest> {
        check_meta(&meta)?;
        let bytes = payload_bytes(&meta, data)?;
        let sha = ids::sha256_tagged(&bytes);
        let id = artifact_id(&meta, &sha);
        let _turn = self.turn(&id);
        self.backend
            .publish(new_manifest(&meta, id, sha, bytes.len() as u64), &bytes)
    }

    /// Publish an artifact made elsewhere (read from an archive), `manifest` and all: the manifest
    /// checked against its id, the bytes against its size and sha256. Returns whether it was
    /// published now (`false`: an intact artifact of that id was stored already, and stays).
    pub fn import(&self, manifest: Manifest, bytes: &[u8]) -> Result<bool> {
        check_manifest(&manifest.artifact_id, &manifest)?;
        ids::check_run_id(&manifest.run_id).map_err(|_| WorldError::ArtifactManifestCorrupt {
            artifact_id: manifest.artifact_id.clone(),
            reason: "its runId is not a run id".into(),
        })?;
        check_size(&manifest, bytes.len() as u64)?;
        check_digest(&manifest, &Sha256::digest(bytes))?;
        let _turn = self.turn(&manifest.artifact_id);
        let stored = self.backend.exists(&manifest.artifact_id)?;
        self.backend.publish(manifest, bytes)?;
        Ok(!stored)
    }

    /// Take this process's turn at writing artifact `id`.
    fn turn(&self, id: &str) -> ArtifactTurn<'_> {
        let mut busy = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        while busy.contains(id) {
            busy = self.turn_over.wait(busy).unwrap_or_else(|p| p.into_inner());
        }
        busy.insert(id.to_string());
        ArtifactTurn {
            store: self,
            id: id.to_string(),
        }
    }

    /// Read an artifact and verify it: the manifest against its id, the blob's size and hash.
    pub fn read(&self, id: &str) -> Result<(Manifest, Bytes)> {
        self.backend.read(id)
    }

    /// Whether an artifact `id` is published (without reading it).
    pub fn exists(&self, id: &str) -> Result<bool> {
        self.backend.exists(id)
    }

    /// The artifacts that runs of `runs` made: each with its run, id and size in bytes, sorted.
    pub fn owned_by(&self, runs: &[&str]) -> Result<Vec<(String, String, u64)>> {
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let mut owned = self.backend.owned_by(runs)?;
        owned.sort();
        Ok(owned)
    }

    /// Remove the artifact `id`, taking its turn as a writer of it does.
    pub fn remove(&self, id: &str) -> Result<()> {
        let _turn = self.turn(id);
        self.backend.remove(id)
    }

    /// Bytes stored without a manifest (see [`ArtifactBackend::orphans`]), sorted by id.
    pub fn orphans(&self) -> Result<Vec<bucket::Listed>> {
        let mut orphans = self.backend.orphans()?;
        orphans.sort_by(|a, b| a.artifact_id.cmp(&b.artifact_id));
        Ok(orphans)
    }

    /// Remove the orphans last written before `before`; returns how many. Taking each one's turn,
    /// as a writer of it does, so that this process's own write of it is not undone.
    pub fn remove_orphans(&self, before: std::time::SystemTime) -> Result<u64> {
        let mut removed = 0;
        for orphan in self.backend.orphans()?.into_iter().filter(|o| o.modified < before) {
            let _turn = self.turn(&orphan.artifact_id);
            self.backend.remove_orphan(&orphan.artifact_id)?;
            removed += 1;
        }
        Ok(removed)
    }

    /// Move up to `limit` artifacts kept in the store the backend was opened over into its own
    /// (see [`ArtifactBackend::move_in`]), each taking its turn as a writer of it does; returns how
    /// many were moved, their bytes, and how many are left.
    pub fn move_in(&self, limit: usize) -> Result<(u64, u64, u64)> {
        let mut ids = self.backend.kept_elsewhere()?;
        ids.sort();
        let (mut moved, mut bytes) = (0, 0);
        for id in ids.iter().take(limit) {
            let _turn = self.turn(id);
            if let Some(size) = self.backend.move_in(id)? {
                moved += 1;
                bytes += size;
            }
        }
        Ok((moved, bytes, ids.len().saturating_sub(limit) as u64))
    }

    /// Ids of every published artifact, sorted.
    pub fn list(&self) -> Result<Vec<String>> {
        let mut ids = self.backend.list()?;
        ids.sort();
        Ok(ids)
    }
}

/// One writer's turn at an artifact: while it lives, no other writer in this process touches `id`.
struct ArtifactTurn<'a> {
    store: &'a ArtifactStore,
    id: String,
}

impl Drop for ArtifactTurn<'_> {
    fn drop(&mut self) {
        let mut busy = self.store.writing.lock().unwrap_or_else(|p| p.into_inner());
        busy.remove(&self.id);
        self.store.turn_over.notify_all();
    }
}

pub(crate) fn not_found(id: &str) -> WorldError {
    WorldError::ArtifactNotFound {
        artifact_id: id.to_string(),
        run_id: None,
        path: None,
    }
}

pub(crate) fn new_manifest(meta: &NewArtifact, id: String, sha256: String, size: u64) -> Manifest {
    Manifest {
        artifact_ref: format!("{REF_PREFIX}{id}"),
        artifact_id: id,
        run_id: meta.run_id.clone(),
        step_path: meta.step_path.clone(),
        name: meta.name.clone(),
        content_type: meta.content_type.clone(),
        encoding: meta.encoding,
        sha256,
        size_bytes: size,
        created_at: clock::now_iso(),
    }
}

/// Check a stored manifest `m` against the id it is stored under: it names that id, and its fields
/// hash to it (so a manifest edited to describe other bytes is found out).
pub(crate) fn check_manifest(id: &str, m: &Manifest) -> Result<()> {
    let corrupt = |reason: String| WorldError::ArtifactManifestCorrupt {
        artifact_id: id.to_string(),
        reason,
    };
    if m.artifact_id != id || m.artifact_ref != format!("{REF_PREFIX}{id}") {
        return Err(corrupt(format!("the manifest names {} instead", m.artifact_id)));
    }
    let meta = NewArtifact {
        run_id: m.run_id.clone(),
        step_path: m.step_path.clone(),
        name: m.name.clone(),
        content_type: m.content_type.clone(),
        encoding: m.encoding,
    };
    if artifact_id(&meta, &m.sha256) != id {
        return Err(corrupt("the manifest's fields do not hash to its id".into()));
    }
    Ok(())
}

/// Check the size of a blob, `len` bytes, against its manifest `m`.
pub(crate) fn check_size(m: &Manifest, len: u64) -> Result<()> {
    if len != m.size_bytes {
        return Err(WorldError::ArtifactManifestCorrupt {
            artifact_id: m.artifact_id.clone(),
            reason: format!("sizeBytes is {} but the blob holds {len} bytes", m.size_bytes),
        });
    }
    Ok(())
}

/// Check the sha256 of a blob, `digest`, against its manifest `m`.
pub(crate) fn check_digest(m: &Manifest, digest: &[u8]) -> Result<()> {
    let actual = format!("sha256:{}", hex::encode(digest));
    if actual != m.sha256 {
        return Err(WorldError::ArtifactHashMismatch {
            artifact_id: m.artifact_id.clone(),
            expected: m.sha256.clone(),
            actual,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
