//! A virtual world: everything in memory, under the same rules, nothing on disk.

use super::{Parts, World};
use crate::artifacts::{r#virtual::VirtualArtifacts, ArtifactStore};
use crate::error::Result;
use crate::locks::{r#virtual::VirtualLocks, Locks};
use crate::outer_loop::{r#virtual::VirtualManifests, OuterLoops};
use crate::runtime::Completer;
use crate::store::r#virtual::VirtualLog;
use crate::vocabulary::Materializer;
use std::sync::Arc;

impl World {
    /// Open a fresh in-memory world.
    pub fn open_virtual(materializer: Arc<dyn Materializer>, completer: Arc<dyn Completer>) -> Result<World> {
        let log = VirtualLog::new();
        let parts = Parts {
            kind: "virtual",
            data_dir: None,
            writer: Some(Box::new(log.clone())),
            reader: Arc::new(log),
            artifacts: ArtifactStore::new(VirtualArtifacts::new()),
            locks: Locks::new(VirtualLocks::new()),
            outer_loops: OuterLoops::new(VirtualManifests::new()),
        };
        World::open(parts, materializer, completer)
    }
}
