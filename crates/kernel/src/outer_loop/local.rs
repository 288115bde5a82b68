//! The outer-loop manifests of a local world: `<dataDir>/outer-loops/<outerLoopId>.json`.
//!
//! A manifest is written to a temporary file of its own (pid + counter, so overlapping writes
//! never mix bytes), fsynced, and renamed into place, or, for the first manifest, hard-linked
//! into place, which fails where one exists; the directory is fsynced. This process's writes of
//! one manifest take turns under a mutex kept in a process-wide map keyed by the file's resolved
//! path, so two worlds opened on one data directory share it.

use super::{unpoisoned, ManifestStore, MANIFEST_MAX};
use crate::durable::{create_dir_synced, remove_stale_tmp, sync_dir, TmpFile};
use crate::error::{Result, WorldError};
use crate::files::{self, Unreadable};
use std::collections::HashMap;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// Manifests as files under a data directory.
pub struct LocalManifests {
    /// The resolved `<dataDir>/outer-loops`.
    dir: PathBuf,
}

impl LocalManifests {
    /// The manifests of the local world at `data_dir`; creates their directory and removes the
    /// temporary files of writes a crash cut short.
    pub fn open(data_dir: &Path) -> Result<LocalManifests> {
        let dir = data_dir.join("outer-loops");
        create_dir_synced(&dir, "the outer-loops directory")?;
        // Resolved, so every handle on this directory keys its write turns by the same paths.
        let dir = dir
            .canonicalize()
            .map_err(|e| WorldError::io("resolving the outer-loops directory", Some(dir.clone()), e))?;
        remove_stale_tmp(&dir);
        Ok(LocalManifests { dir })
    }

    /// The manifests of a world opened for reading only (at its resolved `data_dir`): nothing is
    /// created or cleaned up.
    pub fn read_only(data_dir: &Path) -> LocalManifests {
        LocalManifests {
            dir: data_dir.join("outer-loops"),
        }
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }
}

impl ManifestStore for LocalManifests {
    fn place(&self, id: &str) -> String {
        self.path(id).display().to_string()
    }

    fn load(&self, id: &str) -> Result<Option<Vec<u8>>> {
        let path = self.path(id);
        match files::read_small(&path, MANIFEST_MAX as u64) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(Unreadable::Missing) => Ok(None),
            Err(Unreadable::Io(e)) => Err(WorldError::io("reading an outer-loop manifest", Some(path), e)),
            Err(other) => Err(WorldError::RuntimeIntegrity {
                reason: format!("outer-loop manifest {}", other.describe(&path)),
            }),
        }
    }

    fn publish(&self, id: &str, text: &str, first: bool) -> Result<bool> {
        let path = self.path(id);
        // Held (locked) until this returns, after the rename or link.
        let tmp = TmpFile::write_synced(&self.dir, &format!("{id}.json"), text.as_bytes())?;
        let published = if first {
            fs::hard_link(&tmp.path, &path)
        } else {
            fs::rename(&tmp.path, &path)
        };
        let _ = fs::remove_file(&tmp.path);
        match published {
            Ok(()) => sync_dir(&self.dir).map(|()| true),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(WorldError::io("publishing an outer-loop manifest", Some(path), e)),
        }
    }

    fn turn(&self, id: &str) -> Arc<Mutex<()>> {
        write_turn(&self.path(id))
    }
}

/// The mutex that serializes this process's writes of the manifest at `path` (a resolved path).
/// Every handle on the file gets the same one while any write holds it; entries no write holds
/// any more are dropped when a new one is added, so the map stays as small as the writes in flight.
pub(super) fn write_turn(path: &Path) -> Arc<Mutex<()>> {
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
