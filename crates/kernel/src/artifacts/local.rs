//! The artifacts of a local world: `<dataDir>/artifacts/<id>.json` beside
//! `artifacts/blobs/<id>.bin`.
//!
//! Publishing is crash-safe and race-safe:
//!
//! 1. the bytes are written to a temporary file in `blobs/`, fsynced, and renamed to
//!    `blobs/<id>.bin`; the directory is fsynced;
//! 2. the manifest is written to a temporary file, fsynced, and hard-linked to `<id>.json`, which
//!    fails if another writer got there first (then its manifest is the answer); the directory is
//!    fsynced.
//!
//! So a manifest never exists without its complete blob, and concurrent writers, in one process or
//! several, end with one intact artifact. A temporary file left by a crash is ignored by readers
//! and removed when a world next opens the directory, once its writer is gone
//! ([`crate::durable::remove_stale_tmp`]). Every read re-hashes the bytes, on two threads
//! (see [`super::hashed_read`]).

use super::{check_digest, check_manifest, check_size, hashed_read, not_found, ArtifactBackend, Manifest};
use crate::bytes::Bytes;
use crate::durable::{create_dir_synced, remove_stale_tmp, sync_dir, TmpFile};
use crate::error::{Result, WorldError};
use crate::files::{self, Unreadable};
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// No manifest is this large: its fields are at most 1 KiB each, even escaped far less than this.
const MANIFEST_MAX: u64 = 1 << 20;

/// Artifacts as files under a data directory.
pub struct LocalArtifacts {
    dir: PathBuf,
    blobs: PathBuf,
}

impl LocalArtifacts {
    /// The artifacts of the local world at `data_dir`; creates their directories and removes the
    /// temporary files whose writer is gone.
    pub fn open(data_dir: &Path) -> Result<LocalArtifacts> {
        let store = LocalArtifacts::read_only(data_dir);
        create_dir_synced(&store.blobs, "the artifacts directory")?;
        for d in [&store.dir, &store.blobs] {
            remove_stale_tmp(d);
        }
        Ok(store)
    }

    /// The artifacts of a world opened for reading only: nothing is created or cleaned up.
    pub fn read_only(data_dir: &Path) -> LocalArtifacts {
        let dir = data_dir.join("artifacts");
        let blobs = dir.join("blobs");
        LocalArtifacts { dir, blobs }
    }

    fn manifest(&self, id: &str) -> Result<Manifest> {
        let path = self.dir.join(format!("{id}.json"));
        let corrupt = |reason: String| WorldError::ArtifactManifestCorrupt {
            artifact_id: id.to_string(),
            reason,
        };
        let text = match files::read_small(&path, MANIFEST_MAX) {
            Ok(t) => t,
            Err(Unreadable::Missing) => return Err(not_found(id)),
            Err(Unreadable::Io(e)) => return Err(WorldError::io("reading a manifest", Some(path), e)),
            Err(other) => return Err(corrupt(format!("the manifest {}", other.describe(&path)))),
        };
        let m: Manifest =
            serde_json::from_slice(&text).map_err(|e| corrupt(format!("the manifest does not parse: {e}")))?;
        check_manifest(id, &m)?;
        Ok(m)
    }
}

impl ArtifactBackend for LocalArtifacts {
    fn publish(&self, manifest: Manifest, bytes: &[u8]) -> Result<Manifest> {
        let id = manifest.artifact_id.clone();
        let existing = match self.read(&id) {
            Ok((m, _)) => return Ok(m),
            Err(WorldError::ArtifactNotFound { .. }) => false,
            Err(e) if e.code() == "WORLD_IO" => return Err(e),
            Err(_) => true, // damaged: publish the fresh bytes over it
        };
        let manifest_path = self.dir.join(format!("{id}.json"));
        let blob_path = self.blobs.join(format!("{id}.bin"));
        // Held (locked) until this function returns, after the blob is renamed into place.
        let tmp = TmpFile::write_synced(&self.blobs, "incoming", bytes)?;
        let published = (|| {
            fs::rename(&tmp.path, &blob_path)
                .map_err(|e| WorldError::io("publishing a blob", Some(blob_path.clone()), e))?;
            sync_dir(&self.blobs)?;
            let tmp_manifest = TmpFile::write_synced(&self.dir, &id, manifest.to_json().as_bytes())?;
            let linked = if existing {
                fs::rename(&tmp_manifest.path, &manifest_path)
            } else {
                let r = fs::hard_link(&tmp_manifest.path, &manifest_path);
                let _ = fs::remove_file(&tmp_manifest.path);
                r
            };
            match linked {
                Ok(()) => {
                    sync_dir(&self.dir)?;
                    Ok(manifest)
                }
                // Another process published this artifact first; its manifest is the answer.
                Err(e) if e.kind() == ErrorKind::AlreadyExists => self.read(&id).map(|(m, _)| m),
                Err(e) => Err(WorldError::io("publishing a manifest", Some(manifest_path.clone()), e)),
            }
        })();
        if published.is_err() {
            let _ = fs::remove_file(&tmp.path);
        }
        published
    }

    fn read(&self, id: &str) -> Result<(Manifest, Bytes)> {
        let manifest = self.manifest(id)?;
        let blob_path = self.blobs.join(format!("{id}.bin"));
        let (file, len) = match files::open_file(&blob_path) {
            Ok(opened) => opened,
            Err(Unreadable::Missing) => {
                return Err(WorldError::ArtifactBlobMissing {
                    artifact_id: id.to_string(),
                    path: blob_path,
                })
            }
            Err(Unreadable::Io(e)) => return Err(WorldError::io("opening a blob", Some(blob_path), e)),
            Err(other) => {
                return Err(WorldError::ArtifactManifestCorrupt {
                    artifact_id: id.to_string(),
                    reason: format!("its blob {}", other.describe(&blob_path)),
                })
            }
        };
        // The size first: a blob of another size is not read at all.
        check_size(&manifest, len)?;
        let mut bytes = Bytes::to_fill(len as usize)
            .map_err(|e| WorldError::io("allocating a buffer for a blob", Some(blob_path.clone()), e))?;
        let digest = hashed_read::read_hashed(&file, bytes.as_mut_slice())
            .map_err(|e| WorldError::io("reading a blob", Some(blob_path.clone()), e))?;
        if hashed_read::holds_more(&file, len)
            .map_err(|e| WorldError::io("reading a blob", Some(blob_path.clone()), e))?
        {
            return Err(WorldError::ArtifactManifestCorrupt {
                artifact_id: id.to_string(),
                reason: "the blob grew while it was read".into(),
            });
        }
        check_digest(&manifest, &digest)?;
        Ok((manifest, bytes))
    }

    fn exists(&self, id: &str) -> Result<bool> {
        Ok(self.dir.join(format!("{id}.json")).is_file())
    }

    fn list(&self) -> Result<Vec<String>> {
        manifest_ids(&self.dir)
    }

    /// Every manifest is read: the files are named by id alone.
    fn owned_by(&self, runs: &[&str]) -> Result<Vec<(String, String, u64)>> {
        let runs: std::collections::HashSet<&str> = runs.iter().copied().collect();
        let mut owned = Vec::new();
        for id in self.list()? {
            match self.manifest(&id) {
                Ok(m) if runs.contains(m.run_id.as_str()) => owned.push((m.run_id, id, m.size_bytes)),
                Ok(_) | Err(WorldError::ArtifactNotFound { .. }) => {}
                Err(e) if e.code() == "WORLD_IO" => return Err(e),
                Err(_) => {}
            }
        }
        Ok(owned)
    }

    fn remove(&self, id: &str) -> Result<()> {
        remove_synced(&self.dir.join(format!("{id}.json")), &self.dir)?;
        remove_synced(&self.blobs.join(format!("{id}.bin")), &self.blobs)
    }
}

/// The ids of the artifacts whose manifests `dir` holds (`<id>.json`); none when it is missing (a
/// world opened read-only creates nothing).
pub(super) fn manifest_ids(dir: &Path) -> Result<Vec<String>> {
    if !dir.exists() {
        return Ok(Vec::new());
    }
    Ok(fs::read_dir(dir)
        .map_err(|e| WorldError::io("listing artifacts", Some(dir.to_path_buf()), e))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".json"))
                .map(str::to_string)
        })
        .filter(|id| crate::ids::is_artifact_id(id))
        .collect())
}

/// Remove the file at `path` and sync its directory `dir`; a missing file is a no-op.
pub(super) fn remove_synced(path: &Path, dir: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => sync_dir(dir),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(WorldError::io("removing an artifact", Some(path.to_path_buf()), e)),
    }
}
