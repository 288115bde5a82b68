//! The test server for the Rust tests of the `postgres` backends: `LITTLE_TEST_DATABASE_URL`,
//! which `scripts/with-postgres.mjs` (and so `npm test`) sets to a throwaway cluster, and a fresh
//! schema per test, dropped when the test is done.

use super::{Db, Options};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::time::Duration;

/// A fresh schema on the test server; dropped with everything in it when this is dropped.
pub struct TestSchema {
    pub url: String,
    pub name: String,
}

impl TestSchema {
    /// The options of a world in this schema (`full` durability, 2 s leases).
    pub fn options(&self) -> Options {
        Options {
            connection_string: self.url.clone(),
            schema: self.name.clone(),
            relaxed: false,
            lease: Duration::from_secs(2),
            max_connections: 4,
            read_only: false,
        }
    }

    /// A database handle on this schema.
    pub fn db(&self) -> Arc<Db> {
        Db::new(self.options()).expect("the test server's options are valid")
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        let db = self.db();
        let sql = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.name);
        let _ = db.block_on(async {
            let client = db.connect().await?;
            client
                .batch_execute(&sql)
                .await
                .map_err(|e| db.error("dropping a test schema", &e))
        });
    }
}

/// A fresh schema on the test server, or None (said once in a `SKIPPED:` line) when there is no
/// server. Under `CI=true` a missing server fails the test instead.
pub fn test_schema() -> Option<TestSchema> {
    static SAID: Once = Once::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let url = match std::env::var("LITTLE_TEST_DATABASE_URL") {
        Ok(u) if !u.is_empty() => u,
        _ => {
            let how = "run them through `npm test` or `node scripts/with-postgres.mjs cargo test` with Debian's postgresql installed, or set LITTLE_TEST_DATABASE_URL";
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("PostgreSQL is missing, and under CI=true the tests that need it must run: {how}");
            }
            SAID.call_once(|| {
                eprintln!("SKIPPED: the Rust tests of the PostgreSQL backend, which need a server: {how}")
            });
            return None;
        }
    };
    let name = format!("rt_{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
    Some(TestSchema { url, name })
}
