//! A virtual world: everything in memory, under the same rules, nothing on disk.

use super::{Parts, World};
use crate::artifacts::{memory::MemoryArtifacts, ArtifactStore};
use crate::error::Result;
use crate::locks::{memory::MemoryLocks, Locks};
use crate::outer_loop::{memory::MemoryManifests, OuterLoops};
use crate::runtime::Completer;
use crate::store::memory::MemoryLog;
use crate::vocabulary::Materializer;
use std::sync::Arc;

impl World {
    /// Open a fresh in-memory world.
    pub fn open_virtual(materializer: Arc<dyn Materializer>, completer: Arc<dyn Completer>) -> Result<World> {
        let log = MemoryLog::new();
        let parts = Parts {
            kind: "virtual",
            data_dir: None,
            writer: Some(Box::new(log.clone())),
            reader: Arc::new(log),
            artifacts: ArtifactStore::new(MemoryArtifacts::new()),
            locks: Locks::new(MemoryLocks::new()),
            outer_loops: OuterLoops::new(MemoryManifests::new()),
        };
        World::open(parts, materializer, completer)
    }
}
