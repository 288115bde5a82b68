//! A local world: a data directory holding a SQLite event store, artifact files, lock
//! directories and outer-loop manifests.

use super::{Parts, World};
use crate::artifacts::bucket::{Bucket, BucketOptions};
use crate::artifacts::local::LocalArtifacts;
use crate::artifacts::objects::{self, LocalObjectManifests};
use crate::error::{Result, WorldError};
use crate::locks::{local::LocalLocks, Locks};
use crate::outer_loop::{local::LocalManifests, OuterLoops};
use crate::runtime::Completer;
use crate::store::sqlite::{self, Durability};
use crate::vocabulary::Materializer;
use std::path::Path;
use std::sync::Arc;

impl World {
    /// Open (creating if needed) the local world at `data_dir`.
    pub fn open_local(
        data_dir: &Path,
        durability: Durability,
        materializer: Arc<dyn Materializer>,
        completer: Arc<dyn Completer>,
    ) -> Result<World> {
        World::open_local_with(data_dir, durability, None, materializer, completer)
    }

    /// As [`World::open_local`], with the artifacts' bytes in the bucket `bucket` names, if any.
    pub fn open_local_with(
        data_dir: &Path,
        durability: Durability,
        bucket: Option<BucketOptions>,
        materializer: Arc<dyn Materializer>,
        completer: Arc<dyn Completer>,
    ) -> Result<World> {
        let bucket = bucket.map(Bucket::open).transpose()?;
        sqlite::check_data_dir_length(data_dir)?;
        crate::durable::create_dir_synced(data_dir, "the data directory")?;
        let data_dir = data_dir
            .canonicalize()
            .map_err(|e| WorldError::io("resolving the data directory", Some(data_dir.to_path_buf()), e))?;
        if !data_dir.is_dir() {
            return Err(WorldError::Path {
                message: format!("{} is not a directory", data_dir.display()),
            });
        }
        let (writer, reader) = sqlite::open(&data_dir, durability)?;
        let parts = Parts {
            kind: "local",
            writer: Some(Box::new(writer)),
            reader: Arc::new(reader),
            artifacts: objects::store(LocalArtifacts::open(&data_dir)?, bucket, || {
                LocalObjectManifests::open(&data_dir)
            })?,
            locks: Locks::new(LocalLocks::open(&data_dir)?),
            outer_loops: OuterLoops::new(LocalManifests::open(&data_dir)?),
            data_dir: Some(data_dir),
        };
        World::open(parts, materializer, completer)
    }

    /// Open the existing local world at `data_dir` for reading only: nothing in the directory is
    /// created, upgraded, cleaned up or written, and every write fails with `WorldError::Path`.
    /// For looking at a world another process (or an earlier version) owns.
    pub fn open_local_read_only(
        data_dir: &Path,
        materializer: Arc<dyn Materializer>,
        completer: Arc<dyn Completer>,
    ) -> Result<World> {
        World::open_local_read_only_with(data_dir, None, materializer, completer)
    }

    /// As [`World::open_local_read_only`], with the artifacts' bytes in the bucket `bucket` names.
    pub fn open_local_read_only_with(
        data_dir: &Path,
        bucket: Option<BucketOptions>,
        materializer: Arc<dyn Materializer>,
        completer: Arc<dyn Completer>,
    ) -> Result<World> {
        let bucket = bucket.map(Bucket::open).transpose()?;
        let data_dir = data_dir.canonicalize().map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                WorldError::Path {
                    message: format!("no world at {}: the directory does not exist", data_dir.display()),
                }
            } else {
                WorldError::io("resolving the data directory", Some(data_dir.to_path_buf()), e)
            }
        })?;
        if !data_dir.is_dir() {
            return Err(WorldError::Path {
                message: format!("{} is not a directory", data_dir.display()),
            });
        }
        let reader = sqlite::open_read_only(&data_dir)?;
        let parts = Parts {
            kind: "local",
            writer: None,
            reader: Arc::new(reader),
            artifacts: objects::store(LocalArtifacts::read_only(&data_dir), bucket, || {
                Ok(LocalObjectManifests::read_only(&data_dir))
            })?,
            locks: Locks::new(LocalLocks::read_only(&data_dir)),
            outer_loops: OuterLoops::new(LocalManifests::read_only(&data_dir)),
            data_dir: Some(data_dir),
        };
        World::open(parts, materializer, completer)
    }
}
