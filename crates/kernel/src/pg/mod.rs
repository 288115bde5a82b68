//! A PostgreSQL database as the backends of a `postgres` world reach it: one connection string,
//! one schema, a pool of connections, and the runtime their I/O runs on.
//!
//! The core's threads are plain threads; each call here runs its I/O to the end on a small tokio
//! runtime shared by every PostgreSQL world of the process (`little-world-pg`), so nothing of
//! tokio shows above this module. Connections are made when first needed, and a world opens
//! without its server: each call that finds the server down fails with `WORLD_IO` naming host,
//! port and database, and the next call after the server is back connects again.
//!
//! - `target`: the connection string and its TLS settings;
//! - `schema`: the tables, their version, and the migrations between versions.

pub mod schema;
pub mod target;
#[cfg(test)]
pub mod testing;

use crate::error::{Result, WorldError};
use std::sync::{Arc, Mutex};
use std::time::Duration;
pub use target::Server;
use tokio_postgres::Client;

use crate::runtime::io_runtime as runtime;

/// How a `postgres` world was opened.
#[derive(Debug, Clone)]
pub struct Options {
    pub connection_string: String,
    pub schema: String,
    /// `synchronous_commit` off (`durability: 'normal'`): a commit returns once its WAL is in the
    /// server's buffers, before it is written out (within three times `wal_writer_delay`, 200 ms by
    /// default); a crash of the server may lose the commits of that window, and their sequences
    /// then go to other events. Leases and migrations commit with it on all the same.
    pub relaxed: bool,
    /// How long a lock holder's lease lasts without renewal.
    pub lease: Duration,
    /// Connections at most: one for the writer, one for live notifications, the rest pooled.
    pub max_connections: usize,
    /// Only read: the schema is checked, never created or migrated, and nothing is written.
    pub read_only: bool,
}

/// The default schema.
pub const DEFAULT_SCHEMA: &str = "little_workflow";

/// One database and schema, shared by the parts of a world.
pub struct Db {
    pub server: Server,
    /// The schema's name, quoted for SQL (`"little_workflow"`).
    pub schema: String,
    /// The schema's name as given.
    pub schema_name: String,
    pub options: Options,
    config: tokio_postgres::Config,
    tls: tokio_postgres_rustls::MakeRustlsConnect,
    pool: deadpool_postgres::Pool,
    /// Set once the schema is known to be this build's: checked (and migrated) on first use.
    ready: Mutex<bool>,
}

/// A schema name: a plain SQL identifier, so it needs no escaping anywhere it appears.
fn check_schema(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 48
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !name.starts_with("pg_");
    if ok {
        Ok(())
    } else {
        Err(WorldError::validation(
            "schema",
            "must be 1 to 48 lowercase letters, digits and underscores, starting with a letter or underscore, and not pg_",
        ))
    }
}

impl Db {
    /// The database `options` names; connects to nothing yet.
    pub fn new(options: Options) -> Result<Arc<Db>> {
        check_schema(&options.schema)?;
        if options.max_connections < 3 {
            return Err(WorldError::validation(
                "maxConnections",
                "must be at least 3: one for the writer, one for live notifications, one for reads",
            ));
        }
        runtime()?;
        let target::Target {
            mut config,
            tls,
            server,
        } = target::parse(&options.connection_string)?;
        // Operators (and the tests) can tell the world's connections by their name in
        // pg_stat_activity, unless the connection string names them itself.
        if config.get_application_name().is_none() {
            config.application_name(format!("little_workflow {}", options.schema));
        }
        let commit = if options.relaxed { "off" } else { "on" };
        config.options(format!(
            "-c synchronous_commit={commit} -c idle_in_transaction_session_timeout=60000 -c client_encoding=UTF8"
        ));
        let manager = deadpool_postgres::Manager::from_config(
            config.clone(),
            tls.clone(),
            deadpool_postgres::ManagerConfig {
                recycling_method: deadpool_postgres::RecyclingMethod::Fast,
            },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(options.max_connections - 2)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(30)))
            .create_timeout(Some(Duration::from_secs(15)))
            .build()
            .map_err(|e| WorldError::Path {
                message: format!("the connection pool could not be made: {e}"),
            })?;
        Ok(Arc::new(Db {
            server,
            schema: format!("\"{}\"", options.schema),
            schema_name: options.schema.clone(),
            options,
            config,
            tls,
            pool,
            ready: Mutex::new(false),
        }))
    }

    /// Run `f` to its end on the runtime, from a thread of the core (never from the runtime's).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        runtime().expect("started when the world opened").block_on(f)
    }

    /// Run `f` as a task of the runtime, beside the connections' own tasks.
    pub fn spawn<F>(&self, f: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        runtime().expect("started when the world opened").spawn(f)
    }

    /// A connection of the world's own (the writer's, the listener's), outside the pool.
    pub async fn connect(&self) -> Result<Client> {
        let (client, connection) = self
            .config
            .connect(self.tls.clone())
            .await
            .map_err(|e| self.error("connecting", &e))?;
        // The connection's I/O runs on the runtime until the client is dropped or the server
        // goes; its end is what the client's next call reports.
        tokio::spawn(connection);
        Ok(client)
    }

    /// The client configuration and TLS, for a connection whose messages are read by hand.
    pub fn config(&self) -> (&tokio_postgres::Config, &tokio_postgres_rustls::MakeRustlsConnect) {
        (&self.config, &self.tls)
    }

    /// A pooled connection, once the schema is known to be this build's.
    pub async fn pooled(&self) -> Result<deadpool_postgres::Object> {
        let client = self.pool.get().await.map_err(|e| self.pool_error(e))?;
        self.ensure_schema(&client).await?;
        Ok(client)
    }

    /// Check the schema (creating or migrating it) on first use, with `client`.
    pub async fn ensure_schema(&self, client: &Client) -> Result<()> {
        if *self.ready.lock().unwrap_or_else(|p| p.into_inner()) {
            return Ok(());
        }
        schema::migrate(self, client).await?;
        *self.ready.lock().unwrap_or_else(|p| p.into_inner()) = true;
        Ok(())
    }

    /// `table` of this world's schema, for SQL.
    pub fn table(&self, table: &str) -> String {
        format!("{}.{table}", self.schema)
    }

    /// The channel on which commits are announced (`NOTIFY`), per schema.
    pub fn channel(&self) -> String {
        format!("little_workflow_{}", self.schema_name)
    }

    /// A PostgreSQL error as a `WorldError`.
    pub fn error(&self, doing: &str, e: &tokio_postgres::Error) -> WorldError {
        database_error(&self.server, doing, e)
    }

    fn pool_error(&self, e: deadpool_postgres::PoolError) -> WorldError {
        match e {
            deadpool_postgres::PoolError::Backend(e) => self.error("connecting", &e),
            other => WorldError::Database {
                context: "connecting".into(),
                server: Box::new(self.server.clone()),
                message: other.to_string(),
                sqlstate: None,
            },
        }
    }

    /// Let go of the pooled connections.
    pub fn close(&self) {
        self.pool.close();
    }
}

/// A PostgreSQL error as a `WorldError`: `WORLD_IO` naming the server, with the server's message
/// (which never holds the password), or the client's for a connection that failed or went.
pub fn database_error(server: &Server, doing: &str, e: &tokio_postgres::Error) -> WorldError {
    let (message, sqlstate) = match e.as_db_error() {
        Some(db) => (db.message().to_string(), Some(db.code().code().to_string())),
        None => {
            let mut message = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(s) = source {
                message = format!("{message}: {s}");
                source = s.source();
            }
            (message, None)
        }
    };
    WorldError::Database {
        context: doing.to_string(),
        server: Box::new(server.clone()),
        message,
        sqlstate,
    }
}

/// A row's column, or a `WORLD_IO` error naming it: a row of the wrong shape (a schema changed
/// under the world) must not panic, as `Row::get` would.
pub fn col<'a, T: tokio_postgres::types::FromSql<'a>>(row: &'a tokio_postgres::Row, i: usize) -> Result<T> {
    row.try_get(i).map_err(|e| WorldError::EventLogCorrupt {
        run_id: None,
        sequence: None,
        reason: format!("a stored row does not have the shape this version reads: column {i}: {e}"),
    })
}
