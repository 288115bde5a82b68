//! Lock directories: one holder at a time, waiting, and recovery from owners killed at every step.

use super::super::Locks;
use super::*;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

const DEAD_PID: u32 = 2_147_483_646;

fn lock_dir(data: &Path, name: &str) -> PathBuf {
    data.join("locks").join(sha256_hex(name.as_bytes()))
}

/// A lock directory owned by a process that is gone.
fn dead_lock(data: &Path, name: &str) -> PathBuf {
    let dir = lock_dir(data, name);
    fs::create_dir(&dir).unwrap();
    let dead = Owner {
        pid: DEAD_PID,
        token: "lck_dead".into(),
        created_at: "2026-01-01T00:00:00.000Z".into(),
        flock: false,
    };
    fs::write(dir.join("owner.json"), serde_json::to_vec(&dead).unwrap()).unwrap();
    dir
}

fn backdate(path: &Path, by: Duration) {
    let t = SystemTime::now() - by;
    fs::File::open(path).unwrap().set_modified(t).unwrap();
}

fn set_hook(f: impl FnMut(&str) -> std::io::Result<()> + 'static) {
    HOOK.with(|h| *h.borrow_mut() = Some(Box::new(f)));
}

fn clear_hook() {
    HOOK.with(|h| *h.borrow_mut() = None);
}

/// The entries of the locks directory other than lock directories themselves and the
/// recovery-lock files (kept for good, by design).
fn leftovers(data: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(data.join("locks"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.contains('.') && !n.ends_with(".recovery-lock"))
        .collect();
    names.sort();
    names
}

#[test]
fn opening_deletes_what_killed_operations_left_behind() {
    let data = tempfile::tempdir().unwrap();
    let locks = data.path().join("locks");
    fs::create_dir_all(&locks).unwrap();
    let aside = locks.join(format!("{}.stale.lck_x.removed", "a".repeat(64)));
    let old_staged = locks.join(format!("{}.recovery.lck_y.staged", "b".repeat(64)));
    let fresh_staged = locks.join(format!("{}.recovery.lck_z.staged", "c".repeat(64)));
    for d in [&aside, &old_staged, &fresh_staged] {
        fs::create_dir(d).unwrap();
        fs::write(d.join("owner.json"), b"{}").unwrap();
    }
    backdate(&old_staged, OWNER_GRACE * 2);
    Locks::new(LocalLocks::open(data.path()).unwrap());
    assert!(!aside.exists() && !old_staged.exists());
    assert!(fresh_staged.exists(), "a taker may be staging it right now");
}

/// A taker killed after writing its record and before naming it `owner.json` left a whole
/// record: that tells at once whether it is gone, rather than the 30 s grace.
#[test]
fn a_taker_killed_before_naming_its_record_is_judged_by_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let locks = Locks::new(LocalLocks::open(dir.path()).unwrap());
    let name = "run:run_named";
    let record = |flock: bool| {
        serde_json::to_vec(&Owner {
            flock,
            ..Owner::me("lck_writing")
        })
        .unwrap()
    };
    let lock = lock_dir(dir.path(), name);
    fs::create_dir(&lock).unwrap();
    let tmp = lock.join("owner.json.tmp");
    // Its taker is there while it holds the flock on the record: the message names its pid.
    let writing = fs::File::create(&tmp).unwrap();
    if process::lock_for_life(&writing) != Some(true) {
        return; // no flock on this file system
    }
    fs::write(&tmp, record(true)).unwrap();
    let err = locks.acquire(name, Duration::ZERO).unwrap_err();
    assert_eq!(err.code(), "RUN_LOCKED");
    assert_eq!(
        err.to_string(),
        format!(
            "{name} is locked by pid {}, which is writing its owner file",
            std::process::id()
        )
    );
    // Killed: the flock is gone, and the lock is taken at once, well within the grace.
    drop(writing);
    let held = locks.acquire(name, Duration::ZERO).unwrap();
    assert_ne!(held.token, "lck_writing");
    locks.release(name, &held.token).unwrap();

    // A record written without a flock, or cut short, says nothing: the grace applies (a pid
    // means nothing in another pid namespace).
    fs::create_dir(&lock).unwrap();
    for body in [record(false), record(true)[..10].to_vec()] {
        fs::write(&tmp, body).unwrap();
        let err = locks.acquire(name, Duration::ZERO).unwrap_err();
        assert!(err.to_string().ends_with("has not written its owner file yet"), "{err}");
    }
    backdate(&lock, OWNER_GRACE * 2);
    locks.acquire(name, Duration::ZERO).unwrap();
}

/// A taker that stalled before it took its directory's identity, while others recovered the
/// directory and the next taker took it, finds that taker's record and touches nothing.
#[test]
fn a_taker_that_finds_another_takers_record_in_its_directory_gives_up_touching_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let locks_dir = dir.path().join("locks");
    fs::create_dir(&locks_dir).unwrap();
    let lock = locks_dir.join("lock");
    fs::create_dir(&lock).unwrap();
    let theirs = serde_json::to_vec(&Owner::me("lck_next")).unwrap();
    fs::write(lock.join("owner.json"), &theirs).unwrap();
    // Its identity is the next taker's directory's: only the record can tell.
    let out = write_owner(&locks_dir, &lock, dir_id(&lock), "lck_stalled").unwrap();
    assert!(out.is_err(), "it took the lock");
    assert_eq!(fs::read(lock.join("owner.json")).unwrap(), theirs);
    assert!(!lock.join("owner.json.tmp").exists());

    // Its record's name came to hold another taker's record before the link (this one stalled,
    // the next holder released, the one after made its record): that one is named, and left
    // as it is, with its name.
    fs::remove_file(lock.join("owner.json")).unwrap();
    let other = lock.join("other");
    set_hook(move |step| {
        if step == "owner.link" {
            let tmp = other.with_file_name("owner.json.tmp");
            fs::remove_file(&tmp)?;
            fs::write(&other, b"theirs")?;
            fs::rename(&other, &tmp)?;
        }
        Ok(())
    });
    let out = write_owner(&locks_dir, &lock, dir_id(&lock), "lck_stalled").unwrap();
    clear_hook();
    assert!(out.is_err(), "it took the lock");
    assert_eq!(fs::read(lock.join("owner.json")).unwrap(), b"theirs");
    assert_eq!(fs::read(lock.join("owner.json.tmp")).unwrap(), b"theirs");
    fs::remove_file(lock.join("owner.json")).unwrap();
    fs::remove_file(lock.join("owner.json.tmp")).unwrap();

    // The same while the next taker is still writing its record.
    fs::write(lock.join("owner.json.tmp"), b"{").unwrap();
    assert!(write_owner(&locks_dir, &lock, dir_id(&lock), "lck_stalled")
        .unwrap()
        .is_err());
    assert_eq!(fs::read(lock.join("owner.json.tmp")).unwrap(), b"{");
}

/// A looker that holds a new record past the wait makes the taker try again, rather than
/// record no flock (then judged by a pid, which means nothing in another pid namespace).
#[test]
fn a_record_a_looker_holds_too_long_is_given_up_and_taken_again() {
    let dir = tempfile::tempdir().unwrap();
    let locks = Locks::new(LocalLocks::open(dir.path()).unwrap());
    let name = "run:run_looked";
    let lock = lock_dir(dir.path(), name);
    let tmp = lock.join("owner.json.tmp");
    let mut looker = None;
    set_hook(move |step| {
        if step == "owner.created" && looker.is_none() {
            let f = fs::File::open(&tmp)?;
            process::held_elsewhere(&f); // a looker's shared flock, kept
            looker = Some(f);
        }
        Ok(())
    });
    let err = locks.acquire(name, Duration::ZERO).unwrap_err();
    clear_hook();
    assert_eq!(err.code(), "RUN_LOCKED");
    assert!(err.to_string().contains("a looker held the new owner record"), "{err}");
    assert!(!lock.exists());
    let held = locks.acquire(name, Duration::ZERO).unwrap();
    let owner: Owner = serde_json::from_slice(&fs::read(lock.join("owner.json")).unwrap()).unwrap();
    assert!(owner.flock && owner.token == held.token);
}

/// A record is judged by one open of it: one named `owner.json`, or replaced by the next
/// taker's, between reading it and looking at its flock is not taken for an abandoned one.
#[test]
fn a_record_in_the_making_is_judged_by_the_file_that_was_read() {
    let dir = tempfile::tempdir().unwrap();
    let lock = dir.path().join("lock");
    fs::create_dir(&lock).unwrap();
    let tmp = lock.join("owner.json.tmp");
    let body = serde_json::to_vec(&Owner {
        flock: true,
        ..Owner::me("lck_x")
    })
    .unwrap();
    let write = || {
        let f = fs::File::create(&tmp).unwrap();
        let flocked = process::lock_for_life(&f) == Some(true);
        fs::write(&tmp, &body).unwrap();
        (f, flocked)
    };
    let (holder, flocked) = write();
    if !flocked {
        return; // no flock on this file system
    }
    assert!(matches!(in_making(&tmp), InMaking::Held(Some(o)) if o.token == "lck_x"));

    // Named owner.json meanwhile: its taker still holds it.
    let (named, to) = (tmp.clone(), lock.join("owner.json"));
    set_hook(move |step| {
        if step == "in_making.read" {
            fs::rename(&named, &to)?;
        }
        Ok(())
    });
    assert!(matches!(in_making(&tmp), InMaking::Held(_)));
    clear_hook();

    // Released, and the next taker's record made (not flocked yet) in a directory of its own.
    fs::remove_file(lock.join("owner.json")).unwrap();
    let (holder2, _) = write();
    drop(holder);
    let mut holder2 = Some(holder2);
    let (old, next) = (lock.clone(), tmp.clone());
    set_hook(move |step| {
        if step == "in_making.read" {
            drop(holder2.take());
            fs::rename(&old, old.with_extension("released"))?;
            fs::create_dir(&old)?;
            fs::File::create(&next)?;
        }
        Ok(())
    });
    assert!(matches!(in_making(&tmp), InMaking::Unknown));
    clear_hook();

    // Let go of without being named: abandoned.
    fs::write(&tmp, &body).unwrap();
    assert!(matches!(in_making(&tmp), InMaking::Abandoned(o) if o.token == "lck_x"));
}

#[test]
fn one_holder_at_a_time_and_release_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    for locks in [
        Locks::new(LocalLocks::open(dir.path()).unwrap()),
        Locks::new(super::super::r#virtual::VirtualLocks::new()),
    ] {
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
    let locks = Arc::new(Locks::new(LocalLocks::open(dir.path()).unwrap()));
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
    let locks = Locks::new(LocalLocks::open(dir.path()).unwrap());
    dead_lock(dir.path(), "run:run_dead");
    let held = locks.acquire("run:run_dead", Duration::ZERO).unwrap();
    assert_ne!(held.token, "lck_dead");

    // A lock directory whose owner is not written yet is respected during the grace, and the
    // message says so (rather than "pid 0 (token )").
    let fresh = lock_dir(dir.path(), "run:run_fresh");
    fs::create_dir(&fresh).unwrap();
    let err = locks.acquire("run:run_fresh", Duration::ZERO).unwrap_err();
    assert_eq!(err.code(), "RUN_LOCKED");
    assert_eq!(
        err.to_string(),
        "run:run_fresh is locked by a taker that has not written its owner file yet"
    );
    let err = locks.release("run:run_fresh", "lck_x").unwrap_err();
    assert!(err.to_string().contains("not written its owner file yet"), "{err}");
    fs::write(fresh.join("owner.json"), b"{not json").unwrap();
    let err = locks.acquire("run:run_fresh", Duration::ZERO).unwrap_err();
    assert!(err.to_string().contains("owner file is unreadable"), "{err}");
    // After the grace it is presumed abandoned.
    backdate(&fresh, OWNER_GRACE + Duration::from_secs(1));
    locks.acquire("run:run_fresh", Duration::ZERO).unwrap();
    assert_eq!(leftovers(dir.path()), Vec::<String>::new());
}

/// A container restarted on its data directory often gets its old pid back: the locks its
/// previous run held used to look held by a live process (itself) for as long as it ran.
/// Now a flocked record is held exactly while its flock is.
#[cfg(unix)]
#[test]
fn a_lock_is_held_while_its_owner_file_is_flocked_whatever_its_pid() {
    let dir = tempfile::tempdir().unwrap();
    let locks = Locks::new(LocalLocks::open(dir.path()).unwrap());
    // This process's pid, as a restarted container's would be, but no flock held: gone.
    let owned_by = |name: &str, flock: bool| {
        let lock = lock_dir(dir.path(), name);
        fs::create_dir(&lock).unwrap();
        let owner = Owner {
            flock,
            ..Owner::me("lck_before")
        };
        fs::write(lock.join("owner.json"), serde_json::to_vec(&owner).unwrap()).unwrap();
    };
    owned_by("run:run_restarted", true);
    let held = locks.acquire("run:run_restarted", Duration::ZERO).unwrap();
    assert_ne!(held.token, "lck_before");
    let stored: Owner =
        serde_json::from_slice(&fs::read(lock_dir(dir.path(), "run:run_restarted").join("owner.json")).unwrap())
            .unwrap();
    assert!(stored.flock && stored.pid == std::process::id());
    // Held by this process: another world in it (its own open file) cannot take it.
    let other = Locks::new(LocalLocks::open(dir.path()).unwrap());
    assert_eq!(
        other.acquire("run:run_restarted", Duration::ZERO).unwrap_err().code(),
        "RUN_LOCKED"
    );
    // A record of an earlier version (no flock) with a live pid: held, as before.
    owned_by("run:run_old_format", false);
    assert_eq!(
        locks.acquire("run:run_old_format", Duration::ZERO).unwrap_err().code(),
        "RUN_LOCKED"
    );

    // A world dropped without close no longer keeps its locks until the process exits.
    drop(locks);
    let held = other.acquire("run:run_restarted", Duration::ZERO).unwrap();
    other.release(&held.name, &held.token).unwrap();
    assert!(!lock_dir(dir.path(), "run:run_restarted").exists());
}

/// Someone else's recovery counts as holding the lock: the taker waits for it as usual.
/// (A `.recovery` directory once made `try_take` recurse without end.)
#[test]
fn a_lock_another_taker_is_recovering_counts_as_held() {
    let dir = tempfile::tempdir().unwrap();
    let locks = Locks::new(LocalLocks::open(dir.path()).unwrap());
    let name = "run:run_r";
    let lock = dead_lock(dir.path(), name);
    // Another taker recovering it holds the flock on its recovery-lock file.
    let recovering = fs::File::create(lock.with_extension("recovery-lock")).unwrap();
    if process::lock_for_life(&recovering) != Some(true) {
        return; // no flock on this file system
    }
    let err = locks.acquire(name, Duration::ZERO).unwrap_err();
    assert_eq!(err.code(), "RUN_LOCKED");
    assert!(
        err.to_string().contains("another taker is recovering the lock"),
        "{err}"
    );
    // waitMs is respected: the taker polls until its deadline.
    let started = Instant::now();
    let err = locks.acquire(name, Duration::from_millis(120)).unwrap_err();
    assert_eq!(err.code(), "RUN_LOCKED");
    assert!(started.elapsed() >= Duration::from_millis(120));
    drop(recovering);
    let held = locks.acquire(name, Duration::ZERO).unwrap();
    assert_ne!(held.token, "lck_dead");
}

/// A recoverer killed mid-recovery leaves its recovery-lock file unlocked: it blocks nobody,
/// whatever its pid was (pid 1 exists in every container, and used to keep such a lock "live"
/// forever). Recovery directories of earlier versions are not looked at.
#[test]
fn a_recovery_lock_left_by_a_killed_recoverer_blocks_nobody() {
    let dir = tempfile::tempdir().unwrap();
    let locks = Locks::new(LocalLocks::open(dir.path()).unwrap());
    let lock = dead_lock(dir.path(), "run:run_k");
    fs::write(lock.with_extension("recovery-lock"), b"").unwrap();
    let old_format = lock.with_extension("recovery");
    fs::create_dir(&old_format).unwrap();
    let pid1 = Owner {
        pid: 1,
        ..Owner::me("lck_old")
    };
    fs::write(old_format.join("lck_old"), serde_json::to_vec(&pid1).unwrap()).unwrap();
    locks.acquire("run:run_k", Duration::ZERO).unwrap();
}

/// A taker that stalls past the grace while it writes its owner file (a paused container)
/// holds the flock on that file: it is not taken for gone. And one whose lock was recovered
/// meanwhile gives up without touching the next taker's lock.
#[cfg(unix)]
#[test]
fn a_taker_stalled_while_writing_its_owner_keeps_or_cleanly_loses_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let locks = Locks::new(LocalLocks::open(dir.path()).unwrap());
    let writing = lock_dir(dir.path(), "run:run_w");
    fs::create_dir(&writing).unwrap();
    let tmp = fs::File::create(writing.join("owner.json.tmp")).unwrap();
    assert_eq!(process::lock_for_life(&tmp), Some(true));
    backdate(&writing, OWNER_GRACE * 2);
    let err = locks.acquire("run:run_w", Duration::ZERO).unwrap_err();
    assert!(err.to_string().contains("writing its owner file"), "{err}");
    drop(tmp);
    locks.acquire("run:run_w", Duration::ZERO).unwrap();

    // Stalled, and recovered meanwhile: the path now names the next taker's directory.
    let next = lock_dir(dir.path(), "run:run_s");
    let moved = dir.path().join("locks").join("moved-aside");
    let (next_hook, moved_hook) = (next.clone(), moved.clone());
    set_hook(move |step| {
        if step == "owner.write" {
            fs::rename(&next_hook, &moved_hook)?;
            fs::create_dir(&next_hook)?;
            fs::write(
                next_hook.join("owner.json"),
                b"{\"pid\":1,\"token\":\"lck_next\",\"createdAt\":\"x\"}",
            )?;
        }
        Ok(())
    });
    let err = locks.acquire("run:run_s", Duration::ZERO).unwrap_err();
    clear_hook();
    assert!(err.to_string().contains("recovered by another taker"), "{err}");
    let kept: Owner = serde_json::from_slice(&fs::read(next.join("owner.json")).unwrap()).unwrap();
    assert_eq!(kept.token, "lck_next");
}

/// Two releases of one lock at once (double release is a no-op, so callers may do it): the
/// slower one must not remove the lock the next owner took in between.
#[test]
fn two_releases_at_once_cannot_remove_the_next_owners_lock() {
    let dir = tempfile::tempdir().unwrap();
    let locks = Arc::new(Locks::new(LocalLocks::open(dir.path()).unwrap()));
    let name = "run:run_twice";
    let first = locks.acquire(name, Duration::ZERO).unwrap();
    let (checked_tx, checked_rx) = mpsc::channel();
    let slow = {
        let locks = locks.clone();
        let token = first.token.clone();
        std::thread::spawn(move || {
            // This release pauses between its owner check and its rename.
            set_hook(move |step| {
                if step == "release.checked" {
                    let _ = checked_tx.send(());
                    std::thread::sleep(Duration::from_millis(300));
                }
                Ok(())
            });
            locks.release(name, &token)
        })
    };
    checked_rx.recv().unwrap();
    locks.release(name, &first.token).unwrap();
    let next = locks.acquire(name, Duration::from_secs(5)).unwrap();
    slow.join().unwrap().unwrap();
    let owner = read_owner(&lock_dir(dir.path(), name)).unwrap();
    assert_eq!(
        owner.map(|o| o.token),
        Some(next.token),
        "the next owner's lock was removed"
    );
}

#[test]
fn a_lock_whose_owner_cannot_be_written_or_synced_is_not_left_behind() {
    let dir = tempfile::tempdir().unwrap();
    let locks = Locks::new(LocalLocks::open(dir.path()).unwrap());
    for step in ["owner.write", "owner.sync"] {
        set_hook(move |s| {
            if s == step {
                Err(std::io::Error::other("injected"))
            } else {
                Ok(())
            }
        });
        let err = locks.acquire("run:run_io", Duration::ZERO).unwrap_err();
        clear_hook();
        assert_eq!(err.code(), "WORLD_IO", "{step}");
        assert!(!lock_dir(dir.path(), "run:run_io").exists(), "{step}");
        assert_eq!(leftovers(dir.path()), Vec::<String>::new(), "{step}");
        let held = locks.acquire("run:run_io", Duration::ZERO).unwrap();
        locks.release("run:run_io", &held.token).unwrap();
    }
}

#[test]
fn close_lets_go_of_held_locks_and_stops_waiting_takers() {
    let dir = tempfile::tempdir().unwrap();
    // Two worlds on one data directory.
    let a = Arc::new(Locks::new(LocalLocks::open(dir.path()).unwrap()));
    let b = Locks::new(LocalLocks::open(dir.path()).unwrap());
    let x = a.acquire("run:run_x", Duration::ZERO).unwrap();
    let y = a.acquire("outer-loop:ol_y", Duration::ZERO).unwrap();
    let released = a.acquire("run:run_done", Duration::ZERO).unwrap();
    a.release("run:run_done", &released.token).unwrap();
    let z = b.acquire("run:run_z", Duration::ZERO).unwrap();
    let waiting = {
        let a = a.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            (a.acquire("run:run_z", Duration::from_secs(10)), started.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    a.close().unwrap();
    let (out, waited) = waiting.join().unwrap();
    assert_eq!(out.unwrap_err().code(), "WORLD_CLOSED");
    assert!(waited < Duration::from_secs(2), "waited {waited:?}");
    // The closed world's locks are free for others at once.
    b.acquire("run:run_x", Duration::ZERO).unwrap();
    b.acquire("outer-loop:ol_y", Duration::ZERO).unwrap();
    // Releasing them afterwards is the no-op a double release is, even now that b holds them.
    a.release("run:run_x", &x.token).unwrap();
    a.release("outer-loop:ol_y", &y.token).unwrap();
    a.release("run:run_done", &released.token).unwrap();
    assert!(read_owner(&lock_dir(dir.path(), "run:run_x")).unwrap().is_some());
    assert_eq!(
        a.acquire("run:run_n", Duration::ZERO).unwrap_err().code(),
        "WORLD_CLOSED"
    );
    b.release("run:run_z", &z.token).unwrap();

    // The same in memory.
    let m = Arc::new(Locks::new(super::super::r#virtual::VirtualLocks::new()));
    let held = m.acquire("run:run_m", Duration::ZERO).unwrap();
    let waiting = {
        let m = m.clone();
        std::thread::spawn(move || m.acquire("run:run_m", Duration::from_secs(10)))
    };
    std::thread::sleep(Duration::from_millis(100));
    m.close().unwrap();
    assert_eq!(waiting.join().unwrap().unwrap_err().code(), "WORLD_CLOSED");
    // The store has it free: taking it from the store itself succeeds.
    assert!(m.store.try_take("run:run_m", "lck_check").unwrap().is_ok());
    m.store.let_go("run:run_m", "lck_check").unwrap();
    m.release("run:run_m", &held.token).unwrap();
    assert_eq!(
        m.acquire("run:run_m", Duration::ZERO).unwrap_err().code(),
        "WORLD_CLOSED"
    );
}
