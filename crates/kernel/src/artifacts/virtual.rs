//! The artifacts of a virtual world: manifests and bytes in a map.

use super::{not_found, ArtifactBackend, Manifest};
use crate::bytes::Bytes;
use crate::error::Result;
use std::collections::HashMap;
use std::sync::Mutex;

/// Artifacts kept in memory, by id.
#[derive(Default)]
pub struct VirtualArtifacts {
    map: Mutex<HashMap<String, (Manifest, Vec<u8>)>>,
}

impl VirtualArtifacts {
    /// An empty store.
    pub fn new() -> VirtualArtifacts {
        VirtualArtifacts::default()
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Manifest, Vec<u8>)>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl ArtifactBackend for VirtualArtifacts {
    fn publish(&self, manifest: Manifest, bytes: &[u8]) -> Result<Manifest> {
        let mut map = self.map();
        if let Some((m, _)) = map.get(&manifest.artifact_id) {
            return Ok(m.clone());
        }
        map.insert(manifest.artifact_id.clone(), (manifest.clone(), bytes.to_vec()));
        Ok(manifest)
    }

    fn read(&self, id: &str) -> Result<(Manifest, Bytes)> {
        self.map()
            .get(id)
            // A copy: JavaScript may write into the buffer it is handed, and the stored bytes
            // must not change with it.
            .map(|(m, b)| (m.clone(), Bytes::Owned(b.to_vec())))
            .ok_or_else(|| not_found(id))
    }

    fn exists(&self, id: &str) -> Result<bool> {
        Ok(self.map().contains_key(id))
    }

    fn list(&self) -> Result<Vec<String>> {
        Ok(self.map().keys().cloned().collect())
    }

    fn owned_by(&self, runs: &[&str]) -> Result<Vec<(String, String, u64)>> {
        Ok(self
            .map()
            .values()
            .filter(|(m, _)| runs.contains(&m.run_id.as_str()))
            .map(|(m, _)| (m.run_id.clone(), m.artifact_id.clone(), m.size_bytes))
            .collect())
    }

    fn remove(&self, id: &str) -> Result<()> {
        self.map().remove(id);
        Ok(())
    }
}
