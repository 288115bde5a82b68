//! Content-addressed artifacts: `<dataDir>/artifacts/<id>.json` beside `artifacts/blobs/<id>.bin`.
//!
//! An artifact's id is a hash of who made it and of its bytes, so writing the same thing twice
//! yields the same artifact. Publishing is crash-safe and race-safe:
//!
//! 1. the bytes stream into `blobs/<…>.<pid>.<n>.tmp`, hashed on the way, then fsynced;
//! 2. the temporary blob is renamed to `blobs/<id>.bin` and the directory fsynced;
//! 3. the manifest is written to a temporary file, fsynced, and hard-linked to `<id>.json`, which
//!    fails if another writer got there first (then its manifest is the answer); the directory is
//!    fsynced.
//!
//! So a manifest never exists without its complete blob, and concurrent writers, in one process or
//! several, end with one intact artifact. A temporary file left by a crash is ignored by readers
//! and removed when a world next opens the directory, once its writer process is gone. Every read
//! re-hashes the bytes and checks the manifest against its own id.

use crate::core::bytes::Bytes;
use crate::core::canonical;
use crate::core::clock;
use crate::core::error::{Result, WorldError};
use crate::core::events::Artifacts;
use crate::core::files::{self, Unreadable};
use crate::core::ids;
use crate::core::process;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

/// The scheme of an artifact reference string.
pub const REF_PREFIX: &str = "artifact://";

/// Bytes copied, hashed and written at a time.
const CHUNK: usize = 1 << 20;
/// No manifest is this large: its fields are at most 1 KiB each, even escaped far less than this.
const MANIFEST_MAX: u64 = 1 << 20;

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
    if crate::core::events::known::is_artifact_id(id) {
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
fn payload_bytes(meta: &NewArtifact, data: Data) -> Result<Payload> {
    match (meta.encoding, data) {
        (Encoding::Json, Data::Text(text)) => canonical::canonicalize_text(&text)
            .map(|c| Payload(c.into_bytes()))
            .map_err(|e| WorldError::validation("input.payload", e.to_string()).for_run(&meta.run_id)),
        (Encoding::Json, Data::Canonical(c)) | (Encoding::Utf8, Data::Text(c)) => Ok(Payload(c.into_bytes())),
        (Encoding::Bytes, Data::Bytes(b)) => Ok(Payload(b)),
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

/// The bytes to store.
struct Payload(Vec<u8>);

impl Payload {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// The artifacts of one world, on disk or in memory.
pub struct ArtifactStore {
    backend: Backend,
    /// Artifacts being written by this process, so writers of one artifact take turns.
    writing: Mutex<HashSet<String>>,
    turn_over: Condvar,
}

/// An artifact kept in memory: its manifest and its bytes.
type Stored = (Manifest, Vec<u8>);

enum Backend {
    Local { dir: PathBuf, blobs: PathBuf },
    Memory(Mutex<HashMap<String, Stored>>),
}

impl ArtifactStore {
    /// The artifact store of a local world; removes temporary files whose writer is gone.
    pub fn local(data_dir: &Path) -> Result<Self> {
        let store = Self::local_read_only(data_dir);
        if let Backend::Local { dir, blobs } = &store.backend {
            create_dir_synced(blobs, "the artifacts directory")?;
            for d in [dir, blobs] {
                remove_stale_tmp(d);
            }
        }
        Ok(store)
    }

    /// The artifact store of a world opened for reading only: nothing is created or cleaned up.
    pub fn local_read_only(data_dir: &Path) -> Self {
        let dir = data_dir.join("artifacts");
        let blobs = dir.join("blobs");
        Self::with(Backend::Local { dir, blobs })
    }

    /// An in-memory artifact store.
    pub fn memory() -> Self {
        Self::with(Backend::Memory(Mutex::new(HashMap::new())))
    }

    fn with(backend: Backend) -> Self {
        ArtifactStore {
            backend,
            writing: Mutex::new(HashSet::new()),
            turn_over: Condvar::new(),
        }
    }

    /// Store a payload; returns its manifest. Writing an artifact that exists verifies the stored
    /// blob and returns the stored manifest (a damaged one is replaced by the fresh bytes).
    pub fn write(&self, meta: NewArtifact, data: Data) -> Result<Manifest> {
        check_meta(&meta)?;
        let payload = payload_bytes(&meta, data)?;
        match &self.backend {
            Backend::Memory(map) => {
                let bytes = payload.0;
                let sha = ids::sha256_tagged(&bytes);
                let id = artifact_id(&meta, &sha);
                let mut map = map.lock().expect("artifact map");
                if let Some((m, _)) = map.get(&id) {
                    return Ok(m.clone());
                }
                let manifest = new_manifest(&meta, id.clone(), sha, bytes.len() as u64);
                map.insert(id, (manifest.clone(), bytes));
                Ok(manifest)
            }
            Backend::Local { dir, blobs } => self.write_local(dir, blobs, &meta, payload),
        }
    }

    fn write_local(&self, dir: &Path, blobs: &Path, meta: &NewArtifact, payload: Payload) -> Result<Manifest> {
        // Held (locked) until this function returns, after the blob is renamed into place.
        let (tmp, sha, size) = write_hashed(blobs, payload.bytes())?;
        let tmp_blob = &tmp.path;
        drop(payload);
        let id = artifact_id(meta, &sha);
        let _turn = self.turn(&id);
        let manifest_path = dir.join(format!("{id}.json"));
        let blob_path = blobs.join(format!("{id}.bin"));
        let existing = match self.read(&id) {
            Ok((m, _)) => {
                let _ = fs::remove_file(tmp_blob);
                return Ok(m);
            }
            Err(WorldError::ArtifactNotFound { .. }) => false,
            Err(e) if e.code() == "WORLD_IO" => {
                let _ = fs::remove_file(tmp_blob);
                return Err(e);
            }
            Err(_) => true, // damaged: publish the fresh bytes over it
        };
        let published = (|| {
            fs::rename(tmp_blob, &blob_path)
                .map_err(|e| WorldError::io("publishing a blob", Some(blob_path.clone()), e))?;
            sync_dir(blobs)?;
            let manifest = new_manifest(meta, id.clone(), sha, size);
            let tmp_manifest = TmpFile::write_synced(dir, &id, manifest.to_json().as_bytes())?;
            let linked = if existing {
                fs::rename(&tmp_manifest.path, &manifest_path)
            } else {
                let r = fs::hard_link(&tmp_manifest.path, &manifest_path);
                let _ = fs::remove_file(&tmp_manifest.path);
                r
            };
            match linked {
                Ok(()) => {
                    sync_dir(dir)?;
                    Ok(manifest)
                }
                // Another process published this artifact first; its manifest is the answer.
                Err(e) if e.kind() == ErrorKind::AlreadyExists => self.read(&id).map(|(m, _)| m),
                Err(e) => Err(WorldError::io("publishing a manifest", Some(manifest_path.clone()), e)),
            }
        })();
        if published.is_err() {
            let _ = fs::remove_file(tmp_blob);
        }
        published
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
        match &self.backend {
            Backend::Memory(map) => map
                .lock()
                .expect("artifact map")
                .get(id)
                // A copy: JavaScript may write into the buffer it is handed, and the stored bytes
                // must not change with it.
                .map(|(m, b)| (m.clone(), Bytes::Owned(b.to_vec())))
                .ok_or_else(|| not_found(id)),
            Backend::Local { dir, blobs } => {
                let manifest = load_manifest(dir, id)?;
                let blob_path = blobs.join(format!("{id}.bin"));
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
                if len != manifest.size_bytes {
                    return Err(WorldError::ArtifactManifestCorrupt {
                        artifact_id: id.to_string(),
                        reason: format!("sizeBytes is {} but the blob holds {len} bytes", manifest.size_bytes),
                    });
                }
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
                let actual = format!("sha256:{}", hex::encode(digest));
                if actual != manifest.sha256 {
                    return Err(WorldError::ArtifactHashMismatch {
                        artifact_id: id.to_string(),
                        expected: manifest.sha256,
                        actual,
                    });
                }
                Ok((manifest, bytes))
            }
        }
    }

    /// Ids of every published artifact (temporary files are not artifacts).
    pub fn list(&self) -> Result<Vec<String>> {
        let mut ids: Vec<String> = match &self.backend {
            Backend::Memory(map) => map.lock().expect("artifact map").keys().cloned().collect(),
            // A world opened read-only creates nothing, so its artifacts directory may be missing.
            Backend::Local { dir, .. } if !dir.exists() => Vec::new(),
            Backend::Local { dir, .. } => fs::read_dir(dir)
                .map_err(|e| WorldError::io("listing artifacts", Some(dir.clone()), e))?
                .filter_map(|e| e.ok())
                .filter_map(|e| {
                    e.file_name()
                        .to_str()
                        .and_then(|n| n.strip_suffix(".json"))
                        .map(str::to_string)
                })
                .filter(|id| crate::core::events::known::is_artifact_id(id))
                .collect(),
        };
        ids.sort();
        Ok(ids)
    }
}

impl Artifacts for ArtifactStore {
    fn artifact_exists(&self, artifact_id: &str) -> Result<bool> {
        match &self.backend {
            Backend::Local { dir, .. } => Ok(dir.join(format!("{artifact_id}.json")).is_file()),
            Backend::Memory(map) => Ok(map.lock().expect("artifact map").contains_key(artifact_id)),
        }
    }

    fn json_id(&self, run_id: &str, step_path: &str, name: &str, canonical_json: &str) -> String {
        artifact_id(
            &json_meta(run_id, step_path, name),
            &ids::sha256_tagged(canonical_json.as_bytes()),
        )
    }

    fn store_json(&self, run_id: &str, step_path: &str, name: &str, canonical_json: String) -> Result<String> {
        self.write(json_meta(run_id, step_path, name), Data::Canonical(canonical_json))
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

fn not_found(id: &str) -> WorldError {
    WorldError::ArtifactNotFound {
        artifact_id: id.to_string(),
        run_id: None,
        path: None,
    }
}

fn new_manifest(meta: &NewArtifact, id: String, sha256: String, size: u64) -> Manifest {
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

fn load_manifest(dir: &Path, id: &str) -> Result<Manifest> {
    let path = dir.join(format!("{id}.json"));
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
    Ok(m)
}

/// A temporary file name that says which process writes it, unique within the process
/// (`<stem>.<pid>.<counter>-<nanos>-flock.tmp`). The `flock` part says its writer holds an
/// `flock` on it (see [`TmpFile`]). Earlier versions named theirs without it, and find the pid
/// where they look for it (the second part from the end), so they judge these files by pid as
/// they judge their own, and never take a live writer's file for a leftover.
fn tmp_name(stem: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{stem}.{}.{n}-{nanos}-flock.tmp", std::process::id())
}

/// A temporary file this process is writing, to be renamed (or linked) into place. Its writer
/// holds an `flock` on it from its creation until the `TmpFile` is dropped, after the rename, so
/// a world opening meanwhile, in any process and any pid namespace, tells it from the leftover of
/// a writer that is gone ([`remove_stale_tmp`]). A pid in the name could not: pids mean nothing
/// across namespaces, and a restarted container often gets its old one back.
pub struct TmpFile {
    pub path: PathBuf,
    file: File,
}

impl TmpFile {
    /// A new, empty, locked file in `dir` named after `stem`.
    fn create(dir: &Path, stem: &str) -> Result<TmpFile> {
        // A cleanup may take the new file for a leftover before it is locked: it then holds the
        // lock or has removed the file, and a fresh name is tried. Bounded, so a file system that
        // says odd things about the files in it cannot spin this forever.
        for _ in 0..16 {
            let path = dir.join(tmp_name(stem));
            let file = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(|e| WorldError::io("creating a temporary file", Some(path.clone()), e))?;
            match process::try_lock(&file) {
                // Still at its name: a cleanup may have removed it meanwhile.
                Some(true) if files::names(&file, &path) => return Ok(TmpFile { path, file }),
                Some(_) => continue,
                // No flock on this file system: a cleanup goes by the pid in the name.
                None => return Ok(TmpFile { path, file }),
            }
        }
        Err(WorldError::io(
            "creating a temporary file",
            Some(dir.to_path_buf()),
            std::io::Error::other("another process kept removing it"),
        ))
    }

    /// A new locked file in `dir` holding `bytes`, fsynced. Removed again if writing fails.
    pub fn write_synced(dir: &Path, stem: &str, bytes: &[u8]) -> Result<TmpFile> {
        let mut tmp = TmpFile::create(dir, stem)?;
        let io = |e| WorldError::io("writing a file", Some(tmp.path.clone()), e);
        let written = tmp.file.write_all(bytes).and_then(|()| tmp.file.sync_all()).map_err(io);
        tmp.or_remove(written)
    }

    /// `self` if `result` is `Ok`; otherwise remove the file and return the error.
    fn or_remove(self, result: Result<()>) -> Result<TmpFile> {
        match result {
            Ok(()) => Ok(self),
            Err(e) => {
                let _ = fs::remove_file(&self.path);
                Err(e)
            }
        }
    }
}

/// Remove the `*.tmp` files in `dir` whose writers are gone: a [`TmpFile`] once no process holds
/// its lock (removed while this one holds it, so no writer can take it up meanwhile), one an
/// earlier version wrote (or one on a file system without `flock`) once no process has the pid
/// in its name.
pub fn remove_stale_tmp(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        // Only a regular file can be one of the world's own (its type as the directory lists it,
        // a symbolic link not followed): anything else is left alone, and never opened.
        if !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(stem) = name.strip_suffix(".tmp") else {
            continue;
        };
        let path = entry.path();
        let pid_gone = || {
            let pid = stem.rsplit('.').nth(1).and_then(|p| p.parse::<u32>().ok());
            pid.is_none_or(|p| !process::alive(p))
        };
        // A TmpFile's lock, taken here, is held while the file is removed, so that no writer can
        // take the file up meanwhile.
        let mut held = None;
        let gone = if stem.ends_with("-flock") {
            let Ok(file) = files::open_own(&path, false, false) else {
                continue;
            };
            process::try_lock(held.insert(file)).unwrap_or_else(pid_gone)
        } else {
            pid_gone()
        };
        if gone {
            let _ = fs::remove_file(&path);
        }
    }
}

/// Stream `bytes` into a new [`TmpFile`] in `dir`, hashing each chunk as written; fsync. Returns
/// the file, the `sha256:` hash and the size. Each chunk is copied before it is hashed and
/// written, so the hash always describes the bytes on disk even if the source changes meanwhile.
fn write_hashed(dir: &Path, bytes: &[u8]) -> Result<(TmpFile, String, u64)> {
    let mut tmp = TmpFile::create(dir, "incoming")?;
    let io = |e| WorldError::io("writing a blob", Some(tmp.path.clone()), e);
    let mut hasher = Sha256::new();
    let mut chunk = Vec::with_capacity(CHUNK.min(bytes.len()));
    let mut written = Ok(());
    for piece in bytes.chunks(CHUNK) {
        chunk.clear();
        chunk.extend_from_slice(piece);
        hasher.update(&chunk);
        written = tmp.file.write_all(&chunk).map_err(io);
        if written.is_err() {
            break;
        }
    }
    if written.is_ok() {
        written = tmp.file.sync_all().map_err(io);
    }
    let tmp = tmp.or_remove(written)?;
    Ok((
        tmp,
        format!("sha256:{}", hex::encode(hasher.finalize())),
        bytes.len() as u64,
    ))
}

/// Create `dir` and any missing parents, fsyncing each parent a directory was created in, so the
/// new directories themselves survive a crash (not only what is later written into them).
/// `what` names the directory in an error.
pub fn create_dir_synced(dir: &Path, what: &str) -> Result<()> {
    let io = |e| WorldError::io(format!("creating {what}"), Some(dir.to_path_buf()), e);
    // The missing directories (none when `dir` exists), deepest first.
    let mut missing = Vec::new();
    let mut at = Some(dir);
    while let Some(d) = at.filter(|d| !d.as_os_str().is_empty() && !d.is_dir()) {
        missing.push(d);
        at = d.parent();
    }
    for d in missing.into_iter().rev() {
        match fs::create_dir(d) {
            Ok(()) => {
                if let Some(parent) = d.parent().filter(|p| !p.as_os_str().is_empty()) {
                    sync_dir(parent)?;
                }
            }
            // Another process (or world) made it meanwhile; it syncs its parent.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && d.is_dir() => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(WorldError::Path {
                    message: format!(
                        "cannot create {what} {}: {} is not a directory",
                        dir.display(),
                        d.display()
                    ),
                })
            }
            Err(e) => return Err(io(e)),
        }
    }
    Ok(())
}

/// fsync a directory, so the names just renamed or linked into it survive a crash.
pub fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // O_DIRECTORY: whatever else is at the path is refused without being opened for real.
        fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NONBLOCK)
            .open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| WorldError::io("syncing a directory", Some(dir.to_path_buf()), e))
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

mod hashed_read;
#[cfg(test)]
mod tests;
