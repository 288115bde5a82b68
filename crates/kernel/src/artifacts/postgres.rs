//! The artifacts of a `postgres` world: a manifest row in `artifacts` and the bytes in 1 MiB rows
//! of `artifact_chunks`, shared by every host.
//!
//! A publish is one transaction: under a transaction-level advisory lock on the artifact's id
//! (so writers of one artifact on several hosts take turns, and the lock cannot outlive the
//! transaction), it reads the stored artifact, and returns it if intact; otherwise it writes the
//! chunks, then the manifest, and commits. A manifest is thus never visible without its bytes.
//! A read takes the manifest and every chunk in one statement, so in one snapshot, and checks
//! them as a local world checks its files: the manifest against its id, the bytes' size and
//! sha256 against the manifest.

use super::{check_digest, check_manifest, check_size, not_found, ArtifactBackend, Manifest};
use crate::bytes::Bytes;
use crate::error::{Result, WorldError};
use crate::pg::{col, Db};
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// Bytes per chunk row.
const CHUNK: usize = 1 << 20;

pub struct PgArtifacts {
    db: Arc<Db>,
}

impl PgArtifacts {
    pub fn new(db: Arc<Db>) -> PgArtifacts {
        PgArtifacts { db }
    }

    fn corrupt(id: &str, reason: String) -> WorldError {
        WorldError::ArtifactManifestCorrupt {
            artifact_id: id.to_string(),
            reason,
        }
    }

    /// The stored artifact `id`, verified, read with `client`.
    async fn read_with(&self, client: &tokio_postgres::Client, id: &str) -> Result<(Manifest, Bytes)> {
        let db = &self.db;
        let rows = client
            .query(
                &format!(
                    "SELECT a.manifest, a.size_bytes, a.chunks, c.idx, c.data FROM {} a \
                     LEFT JOIN {} c ON c.artifact_id = a.artifact_id WHERE a.artifact_id = $1 ORDER BY c.idx",
                    db.table("artifacts"),
                    db.table("artifact_chunks")
                ),
                &[&id],
            )
            .await
            .map_err(|e| db.error("reading an artifact", &e))?;
        let Some(first) = rows.first() else {
            return Err(not_found(id));
        };
        let text: String = col(first, 0)?;
        let m: Manifest =
            serde_json::from_str(&text).map_err(|e| Self::corrupt(id, format!("the manifest does not parse: {e}")))?;
        check_manifest(id, &m)?;
        let chunks: i32 = col(first, 2)?;
        // The chunks in order (none for an empty blob, whose one row has no chunk).
        let mut parts: Vec<&[u8]> = Vec::with_capacity(rows.len());
        for row in &rows {
            match col::<Option<i32>>(row, 3)? {
                Some(idx) if idx as usize == parts.len() => parts.push(col(row, 4)?),
                Some(_) => break,
                None => {}
            }
        }
        if parts.len() != chunks.max(0) as usize {
            return Err(WorldError::ArtifactBlobMissing {
                artifact_id: id.to_string(),
                path: format!(
                    "{} ({} of its {chunks} chunks in order)",
                    db.table("artifact_chunks"),
                    parts.len()
                )
                .into(),
            });
        }
        let len: usize = parts.iter().map(|p| p.len()).sum();
        check_size(&m, len as u64)?;
        let mut bytes = Bytes::to_fill(len).map_err(|e| WorldError::io("allocating a buffer for a blob", None, e))?;
        let mut hash = Sha256::new();
        let mut at = 0;
        for data in parts {
            bytes.as_mut_slice()[at..at + data.len()].copy_from_slice(data);
            hash.update(data);
            at += data.len();
        }
        check_digest(&m, &hash.finalize())?;
        Ok((m, bytes))
    }
}

impl ArtifactBackend for PgArtifacts {
    fn publish(&self, manifest: Manifest, bytes: &[u8]) -> Result<Manifest> {
        let db = &self.db;
        let id = manifest.artifact_id.clone();
        db.block_on(async {
            let client = db.pooled().await?;
            let fail = |doing: &'static str| move |e: tokio_postgres::Error| db.error(doing, &e);
            client
                .batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED")
                .await
                .map_err(fail("beginning an artifact's transaction"))?;
            let published = async {
                let key = crate::ids::sha256_tagged(id.as_bytes());
                let key = i64::from_str_radix(&key["sha256:".len().."sha256:".len() + 15], 16).expect("hex digits");
                client
                    .query("SELECT pg_advisory_xact_lock($1)", &[&key])
                    .await
                    .map_err(fail("waiting for other writers of an artifact"))?;
                match self.read_with(&client, &id).await {
                    Ok((stored, _)) => return Ok(stored),
                    Err(WorldError::ArtifactNotFound { .. }) => {}
                    Err(e) if e.code() == "WORLD_IO" => return Err(e),
                    Err(_) => {} // damaged: the fresh bytes replace it
                }
                let insert = client
                    .prepare(&format!(
                        "INSERT INTO {} (artifact_id, idx, data) VALUES ($1, $2, $3)",
                        db.table("artifact_chunks")
                    ))
                    .await
                    .map_err(fail("writing an artifact"))?;
                client
                    .execute(
                        &format!("DELETE FROM {} WHERE artifact_id = $1", db.table("artifact_chunks")),
                        &[&id],
                    )
                    .await
                    .map_err(fail("replacing a damaged artifact"))?;
                let writes = bytes.chunks(CHUNK).enumerate().map(|(i, chunk)| {
                    let (insert, id) = (&insert, &id);
                    let client = &client;
                    async move { client.execute(insert, &[id, &(i as i32), &chunk]).await }
                });
                futures_util::future::try_join_all(writes)
                    .await
                    .map_err(fail("writing an artifact's bytes"))?;
                let chunks = bytes.len().div_ceil(CHUNK) as i32;
                client
                    .execute(
                        &format!(
                            "INSERT INTO {} (artifact_id, manifest, size_bytes, chunks) VALUES ($1, $2, $3, $4) \
                             ON CONFLICT (artifact_id) DO UPDATE SET manifest = excluded.manifest, \
                             size_bytes = excluded.size_bytes, chunks = excluded.chunks",
                            db.table("artifacts")
                        ),
                        &[&id, &manifest.to_json(), &(bytes.len() as i64), &chunks],
                    )
                    .await
                    .map_err(fail("writing an artifact's manifest"))?;
                client
                    .query_one("SELECT pg_current_xact_id()::text", &[])
                    .await
                    .map_err(fail("checking an artifact's transaction"))?;
                Ok(manifest)
            }
            .await;
            match published {
                Ok(m) => {
                    client
                        .batch_execute("COMMIT")
                        .await
                        .map_err(fail("committing an artifact"))?;
                    Ok(m)
                }
                Err(e) => {
                    let _ = client.batch_execute("ROLLBACK").await;
                    Err(e)
                }
            }
        })
    }

    fn read(&self, id: &str) -> Result<(Manifest, Bytes)> {
        let db = &self.db;
        db.block_on(async {
            let client = db.pooled().await?;
            self.read_with(&client, id).await
        })
    }

    fn exists(&self, id: &str) -> Result<bool> {
        let db = &self.db;
        db.block_on(async {
            let client = db.pooled().await?;
            let rows = client
                .query(
                    &format!("SELECT 1 FROM {} WHERE artifact_id = $1", db.table("artifacts")),
                    &[&id],
                )
                .await
                .map_err(|e| db.error("looking for an artifact", &e))?;
            Ok(!rows.is_empty())
        })
    }

    fn list(&self) -> Result<Vec<String>> {
        let db = &self.db;
        db.block_on(async {
            let client = db.pooled().await?;
            let rows = client
                .query(&format!("SELECT artifact_id FROM {}", db.table("artifacts")), &[])
                .await
                .map_err(|e| db.error("listing artifacts", &e))?;
            rows.iter().map(|r| col(r, 0)).collect()
        })
    }

    fn owned_by(&self, runs: &[&str]) -> Result<Vec<(String, String, u64)>> {
        let db = &self.db;
        db.block_on(async {
            let client = db.pooled().await?;
            let rows = client
                .query(
                    &format!(
                        "SELECT manifest::jsonb ->> 'runId', artifact_id, size_bytes FROM {} \
                         WHERE manifest::jsonb ->> 'runId' = ANY($1)",
                        db.table("artifacts")
                    ),
                    &[&runs],
                )
                .await
                .map_err(|e| db.error("listing a run's artifacts", &e))?;
            rows.iter()
                .map(|r| Ok((col::<String>(r, 0)?, col::<String>(r, 1)?, col::<i64>(r, 2)? as u64)))
                .collect()
        })
    }

    /// The manifest row and its chunks, in one transaction.
    fn remove(&self, id: &str) -> Result<()> {
        let db = &self.db;
        db.block_on(async {
            let client = db.pooled().await?;
            client
                .batch_execute("BEGIN")
                .await
                .map_err(|e| db.error("removing an artifact", &e))?;
            let removed = async {
                client
                    .execute(
                        &format!("DELETE FROM {} WHERE artifact_id = $1", db.table("artifacts")),
                        &[&id],
                    )
                    .await?;
                client
                    .execute(
                        &format!("DELETE FROM {} WHERE artifact_id = $1", db.table("artifact_chunks")),
                        &[&id],
                    )
                    .await?;
                client.batch_execute("COMMIT").await
            }
            .await;
            if let Err(e) = removed {
                let _ = client.batch_execute("ROLLBACK").await;
                return Err(db.error("removing an artifact", &e));
            }
            Ok(())
        })
    }
}
