//! SQLite's errors as the kernel's [`WorldError`]: damage as `EventLogCorrupt`, anything else as
//! `WorldError::Sqlite` carrying SQLite's own error as its source, with the database file and
//! what the operating system said.

use crate::error::WorldError;
use std::sync::Arc;

impl WorldError {
    /// A SQLite error, turned into [`WorldError::EventLogCorrupt`] when SQLite says the file is
    /// damaged or not a database, or a stored value is not of its column's type (which only
    /// damage makes: every column is written with values of its own type).
    pub fn sqlite(context: impl Into<String>, source: rusqlite::Error) -> Self {
        use rusqlite::ErrorCode;
        let context = context.into();
        let damaged = match &source {
            rusqlite::Error::SqliteFailure(e, _) => {
                matches!(e.code, ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase)
            }
            rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::IntegralValueOutOfRange(..)
            | rusqlite::Error::Utf8Error(..) => true,
            _ => false,
        };
        if damaged {
            return WorldError::EventLogCorrupt {
                run_id: None,
                sequence: None,
                reason: format!("{context}: {source}"),
            };
        }
        WorldError::Sqlite {
            context,
            path: None,
            os: None,
            source: Arc::new(source),
        }
    }

    /// Say which database file a SQLite error is about, and, for an I/O failure or a file that
    /// would not open, what the operating system said (read from `conn`, which failed last).
    pub fn in_database(mut self, db: &std::path::Path, conn: Option<&rusqlite::Connection>) -> Self {
        if let WorldError::Sqlite { path, os, source, .. } = &mut self {
            if path.is_none() {
                *path = Some(db.to_path_buf());
            }
            let io_failure = matches!(
                source
                    .downcast_ref::<rusqlite::Error>()
                    .and_then(rusqlite::Error::sqlite_error_code),
                Some(rusqlite::ErrorCode::SystemIoFailure | rusqlite::ErrorCode::CannotOpen)
            );
            if let (None, true, Some(conn)) = (&os, io_failure, conn) {
                // SAFETY: the handle is valid for as long as `conn` is borrowed; the call only
                // reads the connection's last system error number.
                let errno = unsafe { rusqlite::ffi::sqlite3_system_errno(conn.handle()) };
                if errno != 0 {
                    *os = Some(std::io::Error::from_raw_os_error(errno).to_string());
                }
            }
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_a_database_is_corruption() {
        let err = rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_NOTADB), None);
        assert_eq!(WorldError::sqlite("open", err).code(), "EVENT_LOG_CORRUPT");
    }
}
