//! Artifacts whose bytes are in an S3-compatible bucket (see [`super::bucket`]) and whose
//! manifests stay in the world's own store: files under `<dataDir>/artifacts/objects/` for a local
//! world, rows of `artifact_objects` for a `postgres` one. So listing artifacts, their runs and
//! references never need the bucket; reading one does, and re-hashes what it gets.
//!
//! Publishing is crash-safe and race-safe across hosts:
//!
//! 1. the object is written with a create-only conditional write (`If-None-Match: *`); an object
//!    that is already there (another host's, or one a crash left without its manifest) is read
//!    and checked, and written over if it is not the artifact's bytes;
//! 2. only then is the manifest committed, unless one is stored already (then it is the answer).
//!
//! So a manifest never exists without its object. A crash between the two leaves an object without
//! a manifest, an orphan: `verify` reports it ([`ArtifactBackend::orphans`]), a later write of the
//! same artifact adopts it, and a prune removes it once it is older than an hour.
//!
//! Artifacts the world stored before it was given the bucket stay where they are, in the backend
//! it had (`earlier`), and are read, listed and removed there, until `move_in` moves them.

use super::bucket::{Bucket, Listed};
use super::{check_digest, check_manifest, ArtifactBackend, ArtifactStore, Manifest};
use crate::bytes::Bytes;
use crate::durable::{create_dir_synced, remove_stale_tmp, sync_dir, TmpFile};
use crate::error::{Result, WorldError};
use crate::files::{self, Unreadable};
use crate::pg::{col, Db};
use std::collections::HashSet;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where the manifests of artifacts in a bucket are kept.
pub trait ObjectManifests: Send + Sync {
    /// The manifest of `id`, checked against the id; `None` when there is none.
    fn get(&self, id: &str) -> Result<Option<Manifest>>;
    /// Store `m` unless a manifest of its id is stored (`replace`: over it); returns the one
    /// stored.
    fn put(&self, m: &Manifest, replace: bool) -> Result<Manifest>;
    /// The ids of every manifest.
    fn list(&self) -> Result<Vec<String>>;
    /// The artifacts that runs of `runs` made: run, id and size.
    fn owned_by(&self, runs: &[&str]) -> Result<Vec<(String, String, u64)>>;
    /// Remove the manifest of `id`; a missing one is a no-op.
    fn remove(&self, id: &str) -> Result<()>;
}

/// The artifact store of a world whose own backend is `earlier`: over the world's bucket when it
/// has one, with the manifests `manifests` opens.
pub fn store<M: ObjectManifests + 'static>(
    earlier: impl ArtifactBackend + 'static,
    bucket: Option<Bucket>,
    manifests: impl FnOnce() -> Result<M>,
) -> Result<ArtifactStore> {
    Ok(match bucket {
        None => ArtifactStore::new(earlier),
        Some(b) => ArtifactStore::new(ObjectArtifacts::new(b, manifests()?, earlier)),
    })
}

/// Artifacts in a bucket, with their manifests in `manifests`, over the world's `earlier` backend.
pub struct ObjectArtifacts {
    bucket: Bucket,
    manifests: Box<dyn ObjectManifests>,
    earlier: Box<dyn ArtifactBackend>,
}

impl ObjectArtifacts {
    pub fn new(
        bucket: Bucket,
        manifests: impl ObjectManifests + 'static,
        earlier: impl ArtifactBackend + 'static,
    ) -> ObjectArtifacts {
        ObjectArtifacts {
            bucket,
            manifests: Box::new(manifests),
            earlier: Box::new(earlier),
        }
    }

    /// Whether the object of `m`'s artifact holds exactly its bytes.
    fn intact(&self, m: &Manifest) -> Result<bool> {
        Ok(match self.bucket.read(&m.artifact_id, m.size_bytes)? {
            Some((_, digest)) => check_digest(m, &digest).is_ok(),
            None => false,
        })
    }

    /// The artifact as the world stored it before it had the bucket, if it did.
    fn earlier_intact(&self, id: &str) -> Result<Option<Manifest>> {
        if !self.earlier.exists(id)? {
            return Ok(None);
        }
        match self.earlier.read(id) {
            Ok((m, _)) => Ok(Some(m)),
            Err(e) if e.code() == "WORLD_IO" => Err(e),
            Err(_) => Ok(None), // damaged: published again in the bucket
        }
    }
}

impl ArtifactBackend for ObjectArtifacts {
    fn publish(&self, manifest: Manifest, bytes: &[u8]) -> Result<Manifest> {
        let id = manifest.artifact_id.as_str();
        if let Some(stored) = self.earlier_intact(id)? {
            return Ok(stored);
        }
        let (stored, damaged) = match self.manifests.get(id) {
            Ok(stored) => (stored, false),
            Err(e) if e.code() == "WORLD_IO" => return Err(e),
            Err(_) => (None, true), // replaced below
        };
        if let Some(stored) = stored {
            // Same id, same bytes: the stored manifest describes these. Its object is checked.
            if !self.intact(&stored)? {
                self.bucket.overwrite(id, bytes)?;
            }
            return Ok(stored);
        }
        if !self.bucket.create(id, bytes)? && !self.intact(&manifest)? {
            self.bucket.overwrite(id, bytes)?;
        }
        self.manifests.put(&manifest, damaged)
    }

    fn read(&self, id: &str) -> Result<(Manifest, Bytes)> {
        let Some(m) = self.manifests.get(id)? else {
            return self.earlier.read(id);
        };
        match self.bucket.read(id, m.size_bytes)? {
            Some((bytes, digest)) => {
                check_digest(&m, &digest)?;
                Ok((m, bytes))
            }
            None => Err(WorldError::ArtifactBlobMissing {
                artifact_id: id.to_string(),
                path: PathBuf::from(format!("its object {}", self.bucket.key(id))),
            }),
        }
    }

    fn exists(&self, id: &str) -> Result<bool> {
        let here = match self.manifests.get(id) {
            Ok(m) => m.is_some(),
            Err(e) if e.code() == "WORLD_IO" => return Err(e),
            Err(_) => true,
        };
        Ok(here || self.earlier.exists(id)?)
    }

    fn list(&self) -> Result<Vec<String>> {
        let mut ids = self.manifests.list()?;
        let here: HashSet<String> = ids.iter().cloned().collect();
        ids.extend(self.earlier.list()?.into_iter().filter(|id| !here.contains(id)));
        Ok(ids)
    }

    fn owned_by(&self, runs: &[&str]) -> Result<Vec<(String, String, u64)>> {
        let mut owned = self.manifests.owned_by(runs)?;
        let here: HashSet<String> = owned.iter().map(|o| o.1.clone()).collect();
        owned.extend(
            self.earlier
                .owned_by(runs)?
                .into_iter()
                .filter(|o| !here.contains(&o.1)),
        );
        Ok(owned)
    }

    fn remove(&self, id: &str) -> Result<()> {
        self.manifests.remove(id)?;
        self.bucket.delete(id)?;
        self.earlier.remove(id)
    }

    fn orphans(&self) -> Result<Vec<Listed>> {
        let known: HashSet<String> = self.manifests.list()?.into_iter().collect();
        let mut orphans = Vec::new();
        for listed in self
            .bucket
            .list()?
            .into_iter()
            .filter(|o| !known.contains(&o.artifact_id))
        {
            // Looked at again: its manifest may have been written since the manifests were listed.
            if matches!(self.manifests.get(&listed.artifact_id), Ok(None)) {
                orphans.push(listed);
            }
        }
        Ok(orphans)
    }

    fn kept_elsewhere(&self) -> Result<Vec<String>> {
        self.earlier.list()
    }

    /// The object first, then the manifest, then the artifact's removal from the earlier store:
    /// cut short anywhere, the artifact is readable, and moving it again finishes the move.
    fn move_in(&self, id: &str) -> Result<Option<u64>> {
        let (m, bytes) = match self.earlier.read(id) {
            Ok(read) => read,
            Err(WorldError::ArtifactNotFound { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        if !self.bucket.create(id, &bytes)? && !self.intact(&m)? {
            self.bucket.overwrite(id, &bytes)?;
        }
        self.manifests.put(&m, false)?;
        self.earlier.remove(id)?;
        Ok(Some(m.size_bytes))
    }

    fn remove_orphan(&self, id: &str) -> Result<()> {
        // Adopted since it was listed: it is an artifact now.
        if self.manifests.get(id).map(|m| m.is_some()).unwrap_or(true) {
            return Ok(());
        }
        self.bucket.delete(id)
    }
}

/// No manifest is this large: its fields are at most 1 KiB each, even escaped far less than this.
const MANIFEST_MAX: u64 = 1 << 20;

/// Parse a stored manifest of `id` and check it against the id.
fn parse_manifest(id: &str, text: &[u8]) -> Result<Manifest> {
    let m: Manifest = serde_json::from_slice(text).map_err(|e| WorldError::ArtifactManifestCorrupt {
        artifact_id: id.to_string(),
        reason: format!("the manifest does not parse: {e}"),
    })?;
    check_manifest(id, &m)?;
    Ok(m)
}

/// Manifests of a local world's artifacts in a bucket: `<dataDir>/artifacts/objects/<id>.json`,
/// each written to a temporary file, fsynced, and hard-linked into place (so only the first
/// writer's stays), the directory fsynced.
pub struct LocalObjectManifests {
    dir: PathBuf,
}

impl LocalObjectManifests {
    pub fn open(data_dir: &Path) -> Result<LocalObjectManifests> {
        let m = LocalObjectManifests::read_only(data_dir);
        create_dir_synced(&m.dir, "the object manifests directory")?;
        remove_stale_tmp(&m.dir);
        Ok(m)
    }

    pub fn read_only(data_dir: &Path) -> LocalObjectManifests {
        LocalObjectManifests {
            dir: data_dir.join("artifacts").join("objects"),
        }
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }
}

impl ObjectManifests for LocalObjectManifests {
    fn get(&self, id: &str) -> Result<Option<Manifest>> {
        let path = self.path(id);
        match files::read_small(&path, MANIFEST_MAX) {
            Ok(text) => parse_manifest(id, &text).map(Some),
            Err(Unreadable::Missing) => Ok(None),
            Err(Unreadable::Io(e)) => Err(WorldError::io("reading a manifest", Some(path), e)),
            Err(other) => Err(WorldError::ArtifactManifestCorrupt {
                artifact_id: id.to_string(),
                reason: format!("the manifest {}", other.describe(&path)),
            }),
        }
    }

    fn put(&self, m: &Manifest, replace: bool) -> Result<Manifest> {
        let id = m.artifact_id.as_str();
        let path = self.path(id);
        let tmp = TmpFile::write_synced(&self.dir, id, m.to_json().as_bytes())?;
        let linked = if replace {
            fs::rename(&tmp.path, &path)
        } else {
            let r = fs::hard_link(&tmp.path, &path);
            let _ = fs::remove_file(&tmp.path);
            r
        };
        match linked {
            Ok(()) => {
                sync_dir(&self.dir)?;
                Ok(m.clone())
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => self.get(id)?.ok_or_else(|| super::not_found(id)),
            Err(e) => Err(WorldError::io("publishing a manifest", Some(path), e)),
        }
    }

    fn list(&self) -> Result<Vec<String>> {
        super::local::manifest_ids(&self.dir)
    }

    fn owned_by(&self, runs: &[&str]) -> Result<Vec<(String, String, u64)>> {
        let runs: HashSet<&str> = runs.iter().copied().collect();
        let mut owned = Vec::new();
        for id in self.list()? {
            match self.get(&id) {
                Ok(Some(m)) if runs.contains(m.run_id.as_str()) => owned.push((m.run_id, id, m.size_bytes)),
                Err(e) if e.code() == "WORLD_IO" => return Err(e),
                _ => {}
            }
        }
        Ok(owned)
    }

    fn remove(&self, id: &str) -> Result<()> {
        super::local::remove_synced(&self.path(id), &self.dir)
    }
}

/// Manifests of a `postgres` world's artifacts in a bucket: rows of `artifact_objects`.
pub struct PgObjectManifests {
    db: Arc<Db>,
}

impl PgObjectManifests {
    pub fn new(db: Arc<Db>) -> PgObjectManifests {
        PgObjectManifests { db }
    }
}

impl ObjectManifests for PgObjectManifests {
    fn get(&self, id: &str) -> Result<Option<Manifest>> {
        let db = &self.db;
        let table = db.table("artifact_objects");
        let row = db.block_on(async {
            let client = db.pooled().await?;
            client
                .query_opt(&format!("SELECT manifest FROM {table} WHERE artifact_id = $1"), &[&id])
                .await
                .map_err(|e| db.error("reading a manifest", &e))
        })?;
        row.map(|r| parse_manifest(id, col::<String>(&r, 0)?.as_bytes()))
            .transpose()
    }

    fn put(&self, m: &Manifest, replace: bool) -> Result<Manifest> {
        let db = &self.db;
        let table = db.table("artifact_objects");
        let on_conflict = if replace {
            "DO UPDATE SET manifest = excluded.manifest, run_id = excluded.run_id, size_bytes = excluded.size_bytes"
        } else {
            "DO NOTHING"
        };
        let inserted = db.block_on(async {
            let client = db.pooled().await?;
            client
                .execute(
                    &format!(
                        "INSERT INTO {table} (artifact_id, run_id, manifest, size_bytes) VALUES ($1, $2, $3, $4) \
                         ON CONFLICT (artifact_id) {on_conflict}"
                    ),
                    &[&m.artifact_id, &m.run_id, &m.to_json(), &(m.size_bytes as i64)],
                )
                .await
                .map_err(|e| db.error("publishing a manifest", &e))
        })?;
        if inserted == 1 {
            return Ok(m.clone());
        }
        // Another host's manifest got there first: it is the answer.
        self.get(&m.artifact_id)?
            .ok_or_else(|| super::not_found(&m.artifact_id))
    }

    fn list(&self) -> Result<Vec<String>> {
        let db = &self.db;
        let table = db.table("artifact_objects");
        let rows = db.block_on(async {
            let client = db.pooled().await?;
            client
                .query(&format!("SELECT artifact_id FROM {table}"), &[])
                .await
                .map_err(|e| db.error("listing artifacts", &e))
        })?;
        rows.iter().map(|r| col::<String>(r, 0)).collect()
    }

    fn owned_by(&self, runs: &[&str]) -> Result<Vec<(String, String, u64)>> {
        let db = &self.db;
        let table = db.table("artifact_objects");
        let rows = db.block_on(async {
            let client = db.pooled().await?;
            client
                .query(
                    &format!("SELECT run_id, artifact_id, size_bytes FROM {table} WHERE run_id = ANY($1)"),
                    &[&runs],
                )
                .await
                .map_err(|e| db.error("listing a run's artifacts", &e))
        })?;
        rows.iter()
            .map(|r| Ok((col::<String>(r, 0)?, col::<String>(r, 1)?, col::<i64>(r, 2)? as u64)))
            .collect()
    }

    fn remove(&self, id: &str) -> Result<()> {
        let db = &self.db;
        let table = db.table("artifact_objects");
        db.block_on(async {
            let client = db.pooled().await?;
            client
                .execute(&format!("DELETE FROM {table} WHERE artifact_id = $1"), &[&id])
                .await
                .map_err(|e| db.error("removing an artifact", &e))
        })
        .map(drop)
    }
}
