//! Content-addressed artifacts: `<dataDir>/artifacts/<id>.json` beside `artifacts/blobs/<id>.bin`.

use crate::core::error::{Result, WorldError};
use crate::core::events::ArtifactLookup;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The artifacts of one world, on disk or in memory.
pub struct ArtifactStore {
    backend: Backend,
}

enum Backend {
    Local { dir: PathBuf },
    Memory(Mutex<HashMap<String, (String, Vec<u8>)>>),
}

impl ArtifactStore {
    /// The artifact store of a local world.
    pub fn local(data_dir: &Path) -> Result<Self> {
        let dir = data_dir.join("artifacts");
        std::fs::create_dir_all(dir.join("blobs"))
            .map_err(|e| WorldError::io("creating the artifacts directory", Some(dir.clone()), e))?;
        Ok(ArtifactStore {
            backend: Backend::Local { dir },
        })
    }

    /// An in-memory artifact store.
    pub fn memory() -> Self {
        ArtifactStore {
            backend: Backend::Memory(Mutex::new(HashMap::new())),
        }
    }
}

impl ArtifactLookup for ArtifactStore {
    fn artifact_exists(&self, artifact_id: &str) -> Result<bool> {
        match &self.backend {
            Backend::Local { dir } => Ok(dir.join(format!("{artifact_id}.json")).is_file()),
            Backend::Memory(map) => Ok(map.lock().expect("artifact map").contains_key(artifact_id)),
        }
    }
}
