//! The locks of a `postgres` world: leases in the `leases` table, by the database's clock.
//!
//! Taking a lock is one statement: it takes the row where it is free, expired or already this
//! owner's, and the lease runs `lockLeaseMs` from the server's `statement_timestamp()`. Each
//! change of owner raises the row's `fence`, so a holder that lost its lease can tell (and
//! anything fenced by it can refuse a stale holder). While a lock is held, a task of the
//! runtime renews its lease every third of `lockLeaseMs`, matching owner and fence; a holder
//! whose process dies stops renewing, and its lease expires for the next taker. A release by a
//! token that no longer holds the row (its lease expired and another took it) is refused.
//! Advisory locks are not used for leases: they end with their session, silently, and do not
//! survive a failover or a pooler.

use super::{Attempt, Busy, LockStore};
use crate::error::{Result, WorldError};
use crate::pg::{col, Db};
use std::sync::Arc;
use std::time::Duration;

pub struct PgLocks {
    db: Arc<Db>,
}

impl PgLocks {
    pub fn new(db: Arc<Db>) -> PgLocks {
        PgLocks { db }
    }

    fn lease_ms(&self) -> i64 {
        self.db.options.lease.as_millis().min(i64::MAX as u128) as i64
    }
}

/// Renews a held lease until dropped (after the lock is let go of).
struct Renewal {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Renewal {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_default()
}

/// Run `statement` in a transaction of its own, committed with `synchronous_commit` on when the
/// world's commits are relaxed: a lease lost to a crash of the server would let a second holder
/// run beside the first. One after another, since a statement given as text is prepared first
/// and would otherwise run after the `COMMIT`.
async fn durably<T>(
    db: &Db,
    client: &tokio_postgres::Client,
    statement: impl std::future::Future<Output = std::result::Result<T, tokio_postgres::Error>>,
) -> std::result::Result<T, tokio_postgres::Error> {
    if !db.options.relaxed {
        return statement.await;
    }
    client
        .batch_execute("BEGIN; SET LOCAL synchronous_commit TO on")
        .await?;
    match statement.await {
        Ok(done) => {
            client.batch_execute("COMMIT").await?;
            Ok(done)
        }
        Err(e) => {
            let _ = client.batch_execute("ROLLBACK").await;
            Err(e)
        }
    }
}

impl LockStore for PgLocks {
    fn try_take(&self, name: &str, token: &str) -> Result<Attempt> {
        let db = &self.db;
        let lease = self.lease_ms();
        let taken = db.block_on(async {
            let client = db.pooled().await?;
            let fail = |e: tokio_postgres::Error| db.error("taking a lock", &e);
            let rows = durably(db, &client, client
                .query(
                    &format!(
                        "INSERT INTO {t} AS l (name, owner, fence, expires_at, holder_pid, holder_host, taken_at) \
                         VALUES ($1, $2, 1, statement_timestamp() + $3 * interval '1 millisecond', $4, $5, statement_timestamp()) \
                         ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, \
                           fence = CASE WHEN l.owner = excluded.owner THEN l.fence ELSE l.fence + 1 END, \
                           expires_at = excluded.expires_at, holder_pid = excluded.holder_pid, \
                           holder_host = excluded.holder_host, taken_at = excluded.taken_at \
                         WHERE l.owner IS NULL OR l.expires_at <= statement_timestamp() OR l.owner = excluded.owner \
                         RETURNING fence",
                        t = db.table("leases")
                    ),
                    &[&name, &token, &(lease as f64), &(std::process::id() as i32), &host_name()],
                ))
                .await
                .map_err(fail)?;
            if let Some(row) = rows.first() {
                return Ok(Ok(col::<i64>(row, 0)?));
            }
            let holder = client
                .query_opt(
                    &format!(
                        "SELECT holder_pid, coalesce(holder_host, ''), taken_at::text, expires_at::text FROM {} WHERE name = $1",
                        db.table("leases")
                    ),
                    &[&name],
                )
                .await
                .map_err(fail)?;
            Ok(Err(match holder {
                Some(row) => {
                    let pid: Option<i32> = col(&row, 0)?;
                    let host: String = col(&row, 1)?;
                    let since: Option<String> = col(&row, 2)?;
                    let until: String = col(&row, 3)?;
                    Busy {
                        pid: pid.unwrap_or(0).max(0) as u32,
                        holder: format!(
                            "by pid {} on {} since {}, its lease running until {until}",
                            pid.unwrap_or(0),
                            if host.is_empty() { "an unknown host" } else { &host },
                            since.unwrap_or_default()
                        ),
                    }
                }
                None => Busy {
                    pid: 0,
                    holder: "by a taker that has just let go".into(),
                },
            }))
        })?;
        let fence = match taken {
            Ok(fence) => fence,
            Err(busy) => return Ok(Err(busy)),
        };
        // Renew a third of the way through each lease; the first renewal failing is the holder's
        // loss, which its release then finds (a stale release is refused).
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let (db2, name2, token2) = (db.clone(), name.to_string(), token.to_string());
        let every = Duration::from_millis((lease / 3).max(1) as u64);
        db.block_on(async move {
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = &mut stopped => return,
                        _ = tokio::time::sleep(every) => {}
                    }
                    let renewed = async {
                        let client = db2.pooled().await.ok()?;
                        durably(&db2, &client, client
                            .query(
                                &format!(
                                    "UPDATE {} SET expires_at = statement_timestamp() + $4 * interval '1 millisecond' \
                                     WHERE name = $1 AND owner = $2 AND fence = $3 AND expires_at > statement_timestamp() \
                                     RETURNING 1",
                                    db2.table("leases")
                                ),
                                &[&name2, &token2, &fence, &(lease as f64)],
                            ))
                            .await
                            .ok()
                            .map(|rows| !rows.is_empty())
                    }
                    .await;
                    // Lost: another may hold it now. A failure to reach the server is tried again.
                    if renewed == Some(false) {
                        return;
                    }
                }
            });
        });
        Ok(Ok(Some(Box::new(Renewal { stop: Some(stop) }))))
    }

    fn let_go(&self, name: &str, token: &str) -> Result<()> {
        let db = &self.db;
        db.block_on(async {
            let client = db.pooled().await?;
            let fail = |e: tokio_postgres::Error| db.error("letting go of a lock", &e);
            let released = durably(db, &client, client
                .query(
                    &format!(
                        "UPDATE {} SET owner = NULL, expires_at = statement_timestamp() WHERE name = $1 AND owner = $2 RETURNING 1",
                        db.table("leases")
                    ),
                    &[&name, &token],
                ))
                .await
                .map_err(fail)?;
            if !released.is_empty() {
                return Ok(());
            }
            let holder = client
                .query_opt(
                    &format!(
                        "SELECT holder_pid, coalesce(holder_host, '') FROM {} WHERE name = $1 AND owner IS NOT NULL",
                        db.table("leases")
                    ),
                    &[&name],
                )
                .await
                .map_err(fail)?;
            match holder {
                None => Ok(()),
                Some(row) => {
                    let pid: Option<i32> = col(&row, 0)?;
                    let host: String = col(&row, 1)?;
                    Err(WorldError::RunLocked {
                        name: name.to_string(),
                        owner_pid: pid.unwrap_or(0).max(0) as u32,
                        holder: format!(
                            "by pid {} on {host}: this holder's lease expired and another took the lock",
                            pid.unwrap_or(0)
                        ),
                    })
                }
            }
        })
    }
}
