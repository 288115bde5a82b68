//! A `postgres` world: its event store, artifacts, locks and outer-loop manifests in one
//! PostgreSQL schema, which any number of processes on any number of hosts share.

use super::{Parts, World};
use crate::artifacts::bucket::{Bucket, BucketOptions};
use crate::artifacts::objects::{self, PgObjectManifests};
use crate::artifacts::postgres::PgArtifacts;
use crate::error::Result;
use crate::locks::{postgres::PgLocks, Locks};
use crate::outer_loop::{postgres::PgManifests, OuterLoops};
use crate::pg::{Db, Options};
use crate::runtime::Completer;
use crate::store::postgres::{PgReader, PgWriter};
use crate::vocabulary::Materializer;
use std::sync::Arc;

impl World {
    /// Open the world in the database and schema `options` name. Nothing is connected yet: the
    /// first call that needs the server connects (and creates or migrates the schema).
    pub fn open_postgres(
        options: Options,
        materializer: Arc<dyn Materializer>,
        completer: Arc<dyn Completer>,
    ) -> Result<World> {
        World::open_postgres_with(options, None, materializer, completer)
    }

    /// As [`World::open_postgres`], with the artifacts' bytes in the bucket `bucket` names, if any.
    pub fn open_postgres_with(
        options: Options,
        bucket: Option<BucketOptions>,
        materializer: Arc<dyn Materializer>,
        completer: Arc<dyn Completer>,
    ) -> Result<World> {
        let bucket = bucket.map(Bucket::open).transpose()?;
        let read_only = options.read_only;
        let db = Db::new(options)?;
        let writer = match read_only {
            true => None,
            false => Some(Box::new(PgWriter::new(db.clone())?) as Box<dyn crate::store::LogWriter>),
        };
        let parts = Parts {
            kind: "postgres",
            data_dir: None,
            writer,
            reader: Arc::new(PgReader::new(db.clone())),
            artifacts: objects::store(PgArtifacts::new(db.clone()), bucket, || {
                Ok(PgObjectManifests::new(db.clone()))
            })?,
            locks: Locks::new(PgLocks::new(db.clone())),
            outer_loops: OuterLoops::new(PgManifests::new(db)),
        };
        World::open(parts, materializer, completer)
    }
}
