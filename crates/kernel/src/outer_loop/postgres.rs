//! The outer-loop manifests of a `postgres` world: one row per manifest in `outer_loops`.
//!
//! The first manifest is inserted only where none is (`ON CONFLICT DO NOTHING`), so of two hosts
//! writing it at once one places it and the other is checked against it; later writes replace
//! the row, whole, in one statement. This process's writes of one manifest take turns under the
//! same process-wide mutex map as a local world's, keyed by server, schema and id.

use super::{ManifestStore, MANIFEST_MAX};
use crate::error::{Result, WorldError};
use crate::pg::{col, Db};
use std::path::Path;
use std::sync::{Arc, Mutex};

pub struct PgManifests {
    db: Arc<Db>,
}

impl PgManifests {
    pub fn new(db: Arc<Db>) -> PgManifests {
        PgManifests { db }
    }
}

impl ManifestStore for PgManifests {
    fn place(&self, id: &str) -> String {
        format!("{} row {id} of {}", self.db.table("outer_loops"), self.db.server)
    }

    fn load(&self, id: &str) -> Result<Option<Vec<u8>>> {
        let db = &self.db;
        let row = db.block_on(async {
            let client = db.pooled().await?;
            client
                .query_opt(
                    &format!(
                        "SELECT octet_length(manifest), CASE WHEN octet_length(manifest) <= $2 THEN manifest END FROM {} \
                         WHERE outer_loop_id = $1",
                        db.table("outer_loops")
                    ),
                    &[&id, &(MANIFEST_MAX as i32)],
                )
                .await
                .map_err(|e| db.error("reading an outer-loop manifest", &e))
        })?;
        let Some(row) = row else {
            return Ok(None);
        };
        match col::<Option<String>>(&row, 1)? {
            Some(text) => Ok(Some(text.into_bytes())),
            None => Err(WorldError::RuntimeIntegrity {
                reason: format!(
                    "outer-loop manifest {} holds {} bytes, more than a manifest may",
                    self.place(id),
                    col::<i32>(&row, 0)?
                ),
            }),
        }
    }

    fn publish(&self, id: &str, text: &str, first: bool) -> Result<bool> {
        let db = &self.db;
        let sql = if first {
            format!(
                "INSERT INTO {} (outer_loop_id, manifest) VALUES ($1, $2) ON CONFLICT (outer_loop_id) DO NOTHING",
                db.table("outer_loops")
            )
        } else {
            format!(
                "INSERT INTO {} (outer_loop_id, manifest) VALUES ($1, $2) \
                 ON CONFLICT (outer_loop_id) DO UPDATE SET manifest = excluded.manifest",
                db.table("outer_loops")
            )
        };
        let written = db.block_on(async {
            let client = db.pooled().await?;
            client
                .execute(&sql, &[&id, &text])
                .await
                .map_err(|e| db.error("publishing an outer-loop manifest", &e))
        })?;
        Ok(written == 1)
    }

    fn turn(&self, id: &str) -> Arc<Mutex<()>> {
        let key = format!("postgres:{}/{}/{id}", self.db.server, self.db.schema_name);
        super::local::write_turn(Path::new(&key))
    }
}
