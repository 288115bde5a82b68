//! Run and outer-loop locks: fencing across processes, with stale-owner recovery.
//!
//! A lock is the directory `<dataDir>/locks/<sha256(name)>/`; creating it (`mkdir`, atomic on every
//! local file system) is taking the lock, and `owner.json` inside says who holds it:
//! `{pid, token, createdAt}`. The data directory is resolved to its real path when the world
//! opens, so two paths to one directory contend for the same lock.
//!
//! An owner whose process is gone is stale, and the next taker recovers the lock. A lock
//! directory whose `owner.json` is not written yet belongs to a taker that is between `mkdir` and
//! the write; it is only presumed stale after a grace of 30 seconds. Recovery runs under a lock of
//! its own (`<hash>.recovery`), so two recoverers cannot both win, and re-checks staleness once it
//! holds it. A stale lock is renamed aside before it is deleted, so a taker never sees it half
//! removed.

use crate::core::artifacts::{process_alive, sync_dir, write_synced};
use crate::core::clock;
use crate::core::error::{Result, WorldError};
use crate::core::ids::sha256_hex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// How long a lock directory without a readable owner is presumed to be in the making.
pub const OWNER_GRACE: Duration = Duration::from_secs(30);
/// How often a waiting taker tries again.
const POLL: Duration = Duration::from_millis(20);

/// Who holds a lock, as stored in `owner.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Owner {
    pub pid: u32,
    pub token: String,
    pub created_at: String,
}

/// A lock this process holds.
#[derive(Debug, Clone)]
pub struct Held {
    /// The lock's name (`run:<runId>` or `outer-loop:<outerLoopId>`).
    pub name: String,
    pub token: String,
}

/// The lock name of a run.
pub fn run_lock_name(run_id: &str) -> String {
    format!("run:{run_id}")
}

/// The lock name of an outer loop.
pub fn outer_loop_lock_name(outer_loop_id: &str) -> String {
    format!("outer-loop:{outer_loop_id}")
}

/// A fresh, unguessable token.
fn new_token() -> String {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let seed = format!("{}:{nanos}:{:?}:{n}", std::process::id(), std::thread::current().id());
    format!("lck_{}", &sha256_hex(seed.as_bytes())[..24])
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// The locks of a world, on disk or in memory.
pub enum Locks {
    Local { dir: PathBuf },
    Memory(Mutex<HashMap<String, Owner>>),
}

impl Locks {
    /// The locks of the local world at `data_dir` (already resolved to its real path).
    pub fn local(data_dir: &Path) -> Result<Locks> {
        let dir = data_dir.join("locks");
        fs::create_dir_all(&dir).map_err(|e| WorldError::io("creating the locks directory", Some(dir.clone()), e))?;
        Ok(Locks::Local { dir })
    }

    /// Locks kept in memory, for a virtual world.
    pub fn memory() -> Locks {
        Locks::Memory(Mutex::new(HashMap::new()))
    }

    /// Take the lock `name`, waiting up to `wait` for a live owner to let go.
    pub fn acquire(&self, name: &str, wait: Duration) -> Result<Held> {
        let deadline = Instant::now() + wait;
        let token = new_token();
        loop {
            match self.try_take(name, &token)? {
                None => {
                    return Ok(Held {
                        name: name.to_string(),
                        token,
                    })
                }
                Some(owner) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(WorldError::RunLocked {
                            name: name.to_string(),
                            owner_pid: owner.pid,
                            owner_token: owner.token,
                            since: owner.created_at,
                        });
                    }
                    std::thread::sleep(POLL.min(deadline - now));
                }
            }
        }
    }

    /// One attempt: `None` when the lock is now ours, else its live owner (or the placeholder for
    /// a lock still being written).
    fn try_take(&self, name: &str, token: &str) -> Result<Option<Owner>> {
        let me = Owner {
            pid: std::process::id(),
            token: token.to_string(),
            created_at: clock::now_iso(),
        };
        match self {
            Locks::Memory(map) => {
                let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(owner) = map.get(name) {
                    return Ok(Some(owner.clone()));
                }
                map.insert(name.to_string(), me);
                Ok(None)
            }
            Locks::Local { dir } => {
                let lock_dir = dir.join(sha256_hex(name.as_bytes()));
                match fs::create_dir(&lock_dir) {
                    Ok(()) => {
                        let body = serde_json::to_vec(&me).expect("owner serializes");
                        let tmp = lock_dir.join("owner.json.tmp");
                        write_synced(&tmp, &body)?;
                        fs::rename(&tmp, lock_dir.join("owner.json"))
                            .map_err(|e| WorldError::io("writing a lock owner", Some(lock_dir.clone()), e))?;
                        sync_dir(&lock_dir)?;
                        sync_dir(dir)?;
                        Ok(None)
                    }
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => match inspect(&lock_dir) {
                        Holder::Live(owner) => Ok(Some(owner)),
                        Holder::Stale => {
                            recover(dir, &lock_dir)?;
                            self.try_take(name, token)
                        }
                        Holder::Gone => self.try_take(name, token),
                    },
                    Err(e) => Err(WorldError::io("taking a lock", Some(lock_dir), e)),
                }
            }
        }
    }

    /// Let go of a lock. Letting go of a lock that is already free is a no-op; a token that does
    /// not own a held lock is refused with `RunLockedError`.
    pub fn release(&self, name: &str, token: &str) -> Result<()> {
        match self {
            Locks::Memory(map) => {
                let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
                match map.get(name) {
                    None => Ok(()),
                    Some(o) if o.token == token => {
                        map.remove(name);
                        Ok(())
                    }
                    Some(o) => Err(not_yours(name, o)),
                }
            }
            Locks::Local { dir } => {
                let lock_dir = dir.join(sha256_hex(name.as_bytes()));
                match read_owner(&lock_dir) {
                    Ok(Some(o)) if o.token == token => {
                        remove_aside(dir, &lock_dir, token)?;
                        Ok(())
                    }
                    Ok(Some(o)) => Err(not_yours(name, &o)),
                    Ok(None) => Ok(()),
                    Err(_) if !lock_dir.exists() => Ok(()),
                    Err(_) => Err(WorldError::RunLocked {
                        name: name.to_string(),
                        owner_pid: 0,
                        owner_token: String::new(),
                        since: "(owner being written)".into(),
                    }),
                }
            }
        }
    }
}

fn not_yours(name: &str, owner: &Owner) -> WorldError {
    WorldError::RunLocked {
        name: name.to_string(),
        owner_pid: owner.pid,
        owner_token: owner.token.clone(),
        since: owner.created_at.clone(),
    }
}

enum Holder {
    Live(Owner),
    Stale,
    /// The directory vanished meanwhile: try again.
    Gone,
}

/// Read `owner.json`: `Ok(None)` when the lock directory does not exist.
fn read_owner(lock_dir: &Path) -> std::io::Result<Option<Owner>> {
    match fs::read(lock_dir.join("owner.json")) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e)),
        Err(e) if e.kind() == ErrorKind::NotFound && !lock_dir.exists() => Ok(None),
        Err(e) => Err(e),
    }
}

fn inspect(lock_dir: &Path) -> Holder {
    match read_owner(lock_dir) {
        Ok(Some(owner)) if process_alive(owner.pid) => Holder::Live(owner),
        Ok(Some(_)) => Holder::Stale,
        Ok(None) => Holder::Gone,
        Err(_) => {
            // No readable owner yet: a taker between mkdir and its write, unless it has been so
            // for longer than the grace.
            let age = fs::metadata(lock_dir)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| SystemTime::now().duration_since(t).ok());
            match age {
                None => Holder::Gone,
                Some(a) if a > OWNER_GRACE => Holder::Stale,
                Some(_) => Holder::Live(Owner {
                    pid: 0,
                    token: String::new(),
                    created_at: "(owner being written)".into(),
                }),
            }
        }
    }
}

/// Remove a stale lock under the recovery lock, re-checking that it is still stale.
fn recover(dir: &Path, lock_dir: &Path) -> Result<()> {
    let recovery = lock_dir.with_extension("recovery");
    match fs::create_dir(&recovery) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            // Another process is recovering. A recovery lock left by a crashed recoverer is itself
            // stale after the grace.
            let old = fs::metadata(&recovery)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .is_some_and(|a| a > OWNER_GRACE);
            if old {
                let _ = fs::remove_dir(&recovery);
            }
            return Ok(());
        }
        Err(e) => return Err(WorldError::io("taking a recovery lock", Some(recovery), e)),
    }
    let result = match inspect(lock_dir) {
        Holder::Stale => remove_aside(dir, lock_dir, "stale"),
        Holder::Live(_) | Holder::Gone => Ok(()),
    };
    let _ = fs::remove_dir(&recovery);
    result
}

/// Rename a lock directory aside (atomically freeing the name), then delete it.
fn remove_aside(dir: &Path, lock_dir: &Path, tag: &str) -> Result<()> {
    let aside = dir.join(format!(
        "{}.{tag}.{}.removed",
        lock_dir.file_name().and_then(|n| n.to_str()).unwrap_or("lock"),
        new_token()
    ));
    match fs::rename(lock_dir, &aside) {
        Ok(()) => {
            let _ = fs::remove_dir_all(&aside);
            sync_dir(dir)
        }
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(WorldError::io("removing a lock", Some(lock_dir.to_path_buf()), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_release_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        for locks in [Locks::local(dir.path()).unwrap(), Locks::memory()] {
            let a = locks.acquire("run:run_a", Duration::ZERO).unwrap();
            let err = locks.acquire("run:run_a", Duration::from_millis(50)).unwrap_err();
            assert_eq!(err.code(), "RUN_LOCKED");
            assert!(locks.acquire("run:run_b", Duration::ZERO).is_ok());
            assert_eq!(
                locks.release("run:run_a", "lck_not_the_owner").unwrap_err().code(),
                "RUN_LOCKED"
            );
            locks.release("run:run_a", &a.token).unwrap();
            locks.release("run:run_a", &a.token).unwrap();
            let b = locks.acquire("run:run_a", Duration::ZERO).unwrap();
            assert_ne!(a.token, b.token);
        }
    }

    #[test]
    fn a_waiting_taker_gets_the_lock_when_it_is_released() {
        let dir = tempfile::tempdir().unwrap();
        let locks = std::sync::Arc::new(Locks::local(dir.path()).unwrap());
        let a = locks.acquire("run:run_w", Duration::ZERO).unwrap();
        let l2 = locks.clone();
        let waiter = std::thread::spawn(move || l2.acquire("run:run_w", Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(100));
        locks.release("run:run_w", &a.token).unwrap();
        assert!(waiter.join().unwrap().is_ok());
    }

    #[test]
    fn a_dead_owner_is_recovered_and_a_fresh_ownerless_lock_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let locks = Locks::local(dir.path()).unwrap();
        let lock_dir = dir.path().join("locks").join(sha256_hex(b"run:run_dead"));
        fs::create_dir(&lock_dir).unwrap();
        let dead = Owner {
            pid: 2_147_483_646,
            token: "lck_dead".into(),
            created_at: "2026-01-01T00:00:00.000Z".into(),
        };
        fs::write(lock_dir.join("owner.json"), serde_json::to_vec(&dead).unwrap()).unwrap();
        let held = locks.acquire("run:run_dead", Duration::ZERO).unwrap();
        assert_ne!(held.token, "lck_dead");

        // A lock directory whose owner is not written yet is respected during the grace.
        let fresh = dir.path().join("locks").join(sha256_hex(b"run:run_fresh"));
        fs::create_dir(&fresh).unwrap();
        assert_eq!(
            locks.acquire("run:run_fresh", Duration::ZERO).unwrap_err().code(),
            "RUN_LOCKED"
        );
    }
}
