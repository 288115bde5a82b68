//! The SQLite store: foreign and damaged files, the writer's transactions, the checkpoint thread,
//! writeback and the gathered WAL.

use super::checkpoint::*;
use super::connect::*;
use super::files::*;
use super::writer::*;
use super::*;
use crate::store::{LogReader, LogTx, LogWriter, RowRef, Scope};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

#[test]
fn a_file_that_is_not_a_database_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("events")).unwrap();
    std::fs::write(dir.path().join("events/events.db"), vec![0x42u8; 8192]).unwrap();
    let err = open(dir.path(), Durability::Full).err().unwrap();
    assert_eq!(err.code(), "EVENT_LOG_CORRUPT", "{err}");
}

#[test]
fn a_foreign_database_is_refused_and_left_untouched() {
    // Also one that keeps a user_version of its own, which must not pass for a world's schema
    // version (to be switched to WAL, then fail, or open as a world without tables).
    for (version, tables) in [(0, true), (1, true), (2, true), (3, true), (3, false), (7, true)] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("events")).unwrap();
        let path = dir.path().join("events/events.db");
        let conn = Connection::open(&path).unwrap();
        if tables {
            conn.execute_batch("CREATE TABLE customers (id INTEGER); INSERT INTO customers VALUES (1);")
                .unwrap();
        }
        conn.pragma_update(None, "user_version", version).unwrap();
        drop(conn);
        let before = std::fs::read(&path).unwrap();
        let err = open(dir.path(), Durability::Normal).err().unwrap();
        assert_eq!(err.code(), "WORLD_PATH", "user_version {version}: {err}");
        assert!(
            err.to_string().contains("another application"),
            "user_version {version}: {err}"
        );
        let err = open_read_only(dir.path()).err().unwrap();
        assert!(
            err.to_string().contains("another application"),
            "user_version {version}: {err}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), before);
        assert!(!dir.path().join("events/events.db-wal").exists());
    }
}

/// Commit `rows` rows of about a page each to `run_id` after `after`, in one transaction.
fn commit_rows(writer: &mut SqliteWriter, run_id: &str, after: u64, rows: u64) {
    writer
        .transaction(&Scope::NONE, &mut |tx| insert_rows(tx, run_id, after, rows))
        .unwrap();
}

/// A body that inserts `rows` rows of about a page each to `run_id` after `after`.
fn insert_rows(tx: &mut dyn LogTx, run_id: &str, after: u64, rows: u64) -> Result<()> {
    let pad = "p".repeat(3000);
    for seq in after + 1..=after + rows {
        let envelope = format!("{{\"n\":{seq},\"pad\":\"{pad}\"}}");
        tx.insert(&RowRef::plain(run_id, seq, "evt_0000000000000000", &envelope))?;
    }
    Ok(())
}

fn count_rows(reader: &SqliteReader, run_id: &str) -> usize {
    let mut n = 0;
    reader
        .envelopes(run_id, 0, None, &mut |_| {
            n += 1;
            Ok(())
        })
        .unwrap();
    n
}

#[test]
fn a_transaction_if_immediate_runs_only_where_nothing_would_wait() {
    // At `full` the commit syncs: never now.
    let dir = tempfile::tempdir().unwrap();
    let (mut writer, _reader) = open(dir.path(), Durability::Full).unwrap();
    assert!(writer
        .transaction_if_immediate(&Scope::NONE, &mut |tx| insert_rows(tx, "run_n", 0, 1))
        .is_none());

    let dir = tempfile::tempdir().unwrap();
    let (mut writer, reader) = open(dir.path(), Durability::Normal).unwrap();
    writer
        .transaction(&Scope::NONE, &mut |tx| insert_rows(tx, "run_n", 0, 1))
        .unwrap();
    writer
        .transaction_if_immediate(&Scope::NONE, &mut |tx| insert_rows(tx, "run_n", 1, 1))
        .unwrap()
        .unwrap();
    assert_eq!(count_rows(&reader, "run_n"), 2);

    // Another connection's commits count too: with the WAL grown near the size at which a
    // commit checkpoints inside itself by another connection (its own automatic checkpoint
    // off), not now, though this writer's hook was told nothing of it.
    let another = Connection::open(dir.path().join("events/events.db")).unwrap();
    another
        .execute_batch(&format!(
            "PRAGMA wal_autocheckpoint = 0;
             WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < {CHECKPOINT_INLINE_AT})
             INSERT INTO estimates (run_id, model, open) SELECT 'run_o', printf('%.3000d', n), 1 FROM c;"
        ))
        .unwrap();
    assert!(writer.checkpointer.as_ref().unwrap().wal.pages.load(Ordering::Relaxed) < 100);
    assert!(writer
        .transaction_if_immediate(&Scope::NONE, &mut |tx| insert_rows(tx, "run_n", 2, 1))
        .is_none());
    // A transaction that may wait commits, and checkpoints inside itself; the WAL starts over at
    // the next, and then a transaction runs now again.
    writer
        .transaction(&Scope::NONE, &mut |tx| insert_rows(tx, "run_n", 2, 1))
        .unwrap();
    writer
        .transaction(&Scope::NONE, &mut |tx| insert_rows(tx, "run_n", 3, 1))
        .unwrap();
    writer
        .transaction_if_immediate(&Scope::NONE, &mut |tx| insert_rows(tx, "run_n", 4, 1))
        .unwrap()
        .unwrap();
    assert_eq!(count_rows(&reader, "run_n"), 5);

    // Another connection holds the write lock: declined at once, nothing written, and the
    // body never ran.
    let other = Connection::open(dir.path().join("events/events.db")).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let asked = std::time::Instant::now();
    let mut ran = false;
    let declined = writer.transaction_if_immediate(&Scope::NONE, &mut |tx| {
        ran = true;
        insert_rows(tx, "run_n", 5, 1)
    });
    assert!(declined.is_none());
    assert!(!ran);
    // Not the 30 s busy timeout (a bound far from any machine's speed, not a measurement).
    assert!(asked.elapsed() < Duration::from_secs(10), "{:?}", asked.elapsed());
    // The busy timeout is back for the transactions that may wait: this one waits for the
    // other connection's commit rather than failing at once.
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        other.execute_batch("COMMIT").unwrap();
    });
    writer
        .transaction(&Scope::NONE, &mut |tx| insert_rows(tx, "run_n", 5, 1))
        .unwrap();
    releaser.join().unwrap();
    assert_eq!(count_rows(&reader, "run_n"), 6);
}

#[test]
fn a_transaction_if_immediate_is_declined_before_its_commit_could_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (mut writer, reader) = open(dir.path(), Durability::Normal).unwrap();
    writer
        .transaction(&Scope::NONE, &mut |tx| insert_rows(tx, "run_w", 0, 1))
        .unwrap();
    // A reader's snapshot from before keeps the WAL from starting over, so it only grows.
    let snapshot = Connection::open(dir.path().join("events/events.db")).unwrap();
    snapshot.execute_batch("BEGIN; SELECT COUNT(*) FROM events;").unwrap();
    let (mut rows, mut now) = (1, 0);
    loop {
        let before = writer.checkpointer.as_ref().unwrap().wal.pages.load(Ordering::Relaxed);
        let outcome = writer.transaction_if_immediate(&Scope::NONE, &mut |tx| insert_rows(tx, "run_w", rows, 100));
        if before >= CHECKPOINT_INLINE_AT - NOW_MARGIN {
            assert!(outcome.is_none(), "a commit now at {before} WAL pages");
            break;
        }
        match outcome {
            Some(result) => {
                result.unwrap();
                now += 1;
            }
            // The checkpoint thread was running (woken by the growing WAL, with nothing it
            // may copy): as the world does, commit on a thread that may wait.
            None => writer
                .transaction(&Scope::NONE, &mut |tx| insert_rows(tx, "run_w", rows, 100))
                .unwrap(),
        }
        rows += 100;
        assert!(rows < 20_000, "the WAL stopped growing at {before} pages");
    }
    assert!(now > 0, "no transaction was committed now");
    // What may wait still commits (and checkpoints inside itself, as before).
    writer
        .transaction(&Scope::NONE, &mut |tx| insert_rows(tx, "run_w", rows, 1))
        .unwrap();
    drop(snapshot);
    assert_eq!(count_rows(&reader, "run_w") as u64, rows + 1);
}

/// Wait up to 30 s for `ready`.
fn wait_for(what: &str, ready: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_transaction_if_immediate_is_declined_where_its_commit_would_start_the_wal_over() {
    let dir = tempfile::tempdir().unwrap();
    let (mut writer, reader) = open(dir.path(), Durability::Normal).unwrap();
    let wal = writer.checkpointer.as_ref().unwrap().wal.clone();
    // Enough to wake the checkpoint thread, which then copies all of it.
    commit_rows(&mut writer, "run_s", 0, CHECKPOINT_AT as u64 + 200);
    wait_for("the checkpoint thread never caught up", || {
        wal.checkpointed.load(Ordering::Relaxed) >= wal.pages.load(Ordering::Relaxed)
    });
    // The next commit starts the WAL over, writing (and syncing) its header: not now.
    let mut ran = false;
    assert!(writer
        .transaction_if_immediate(&Scope::NONE, &mut |tx| {
            ran = true;
            insert_rows(tx, "run_s", 1200, 1)
        })
        .is_none());
    assert!(!ran);
    writer
        .transaction(&Scope::NONE, &mut |tx| insert_rows(tx, "run_s", 1200, 1))
        .unwrap();
    let pages = wal.pages.load(Ordering::Relaxed);
    assert!(pages < 16, "the WAL did not start over: {pages} pages");
    assert_eq!(wal.checkpointed.load(Ordering::Relaxed), 0);
    writer
        .transaction_if_immediate(&Scope::NONE, &mut |tx| insert_rows(tx, "run_s", 1201, 1))
        .unwrap()
        .unwrap();
    assert_eq!(count_rows(&reader, "run_s"), 1202);
}

#[test]
fn the_checkpoint_thread_catches_up_with_the_commits_made_while_it_ran() {
    let dir = tempfile::tempdir().unwrap();
    let (mut writer, reader) = open(dir.path(), Durability::Normal).unwrap();
    let wal = writer.checkpointer.as_ref().unwrap().wal.clone();
    // Commits without a pause, well past the size that wakes the thread and short of the
    // one at which a commit checkpoints inside itself; then none.
    let mut n = 0;
    while n < 3 * CHECKPOINT_AT as u64 {
        commit_rows(&mut writer, "run_c", n, 50);
        n += 50;
    }
    // The thread goes on until less than a wake's worth is left, though the wakes sent while
    // it ran were for pages it could not copy.
    wait_for("the checkpoint thread left a wake's worth behind", || {
        wal.pending() < CHECKPOINT_AT
    });
    assert_eq!(count_rows(&reader, "run_c") as u64, n);
}

#[test]
fn a_panic_inside_a_transaction_rolls_it_back_and_releases_the_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let (mut writer, reader) = open(dir.path(), Durability::Normal).unwrap();
    commit_rows(&mut writer, "run_p", 0, 1);
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = writer.transaction(&Scope::NONE, &mut |tx| {
            tx.insert(&RowRef::plain("run_p", 2, "evt_0000000000000000", "{}"))?;
            panic!("a bug in the middle of a group");
        });
    }));
    assert!(panicked.is_err(), "the panic goes on to the caller");
    // Nothing of the panicked transaction stays, and this writer can write again.
    assert_eq!(reader.last_sequence("run_p").unwrap(), 1);
    commit_rows(&mut writer, "run_p", 1, 1);
    assert_eq!(reader.last_sequence("run_p").unwrap(), 2);
    // Another connection (another process) is not kept waiting on a lock left behind.
    let (mut other, _) = open(dir.path(), Durability::Normal).unwrap();
    other.conn.busy_timeout(Duration::from_millis(200)).unwrap();
    commit_rows(&mut other, "run_p", 2, 1);
    assert_eq!(reader.last_sequence("run_p").unwrap(), 3);
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

#[test]
fn writeback_is_due_every_mebibyte_up_to_a_memory_page_boundary_and_again_when_the_wal_starts_over() {
    let mut w = Writeback::new("unused-wal".into(), 4096, 4096);
    let end = |frames: i64| 32 + frames * (4096 + 24);
    let page_below = |bytes: i64| bytes / 4096 * 4096;
    // 1 MiB is reached within frame 255 (ending at 1,050,632 bytes), and the writeback stops
    // at the memory page boundary below its end.
    assert_eq!(w.due(1, 0), None);
    assert_eq!(w.due(254, 0), None);
    assert_eq!(w.due(255, 0), Some((0, page_below(end(255)))));
    assert_eq!(page_below(end(255)), 1_048_576);
    // From where the last one ended, contiguously.
    assert_eq!(w.due(300, 0), None);
    assert_eq!(w.due(600, 0), Some((1_048_576, page_below(end(600)) - 1_048_576)));
    // The WAL started over: counted from its start again, even once it has grown past where
    // the writeback had got to (commits in between were not seen).
    assert_eq!(w.due(700, 1), Some((0, page_below(end(700)))));
    assert_eq!(w.due(10, 2), None);
    assert_eq!(w.due(255, 2), Some((0, 1_048_576)));
    // Other page sizes, of the database and of memory.
    let mut w = Writeback::new("unused-wal".into(), 65536, 16384);
    assert_eq!(w.due(15, 0), None);
    assert_eq!(w.due(16, 0), Some((0, (32 + 16 * (65536 + 24)) / 16384 * 16384)));
}

/// The writer's connection opens its WAL through the VFS that gathers frames, at either
/// durability; a reader's connection (which never writes the WAL) uses the default VFS.
#[test]
fn the_writers_wal_is_gathered_and_a_readers_is_not() {
    for durability in [Durability::Normal, Durability::Full] {
        let dir = tempfile::tempdir().unwrap();
        let (mut writer, reader) = open(dir.path(), durability).unwrap();
        commit_rows(&mut writer, "run_g", 0, 20);
        assert!(super::wal_vfs::gathers(&writer.conn), "{durability:?}");
        assert_eq!(count_rows(&reader, "run_g"), 20);
        assert!(!reader.with_conn(|conn| Ok(super::wal_vfs::gathers(conn))).unwrap());
    }
}

/// The writer starts the writeback of the WAL as commits add to it (`sync_file_range`, which
/// the kernel must accept for the count to grow), and commits stay readable.
#[cfg(target_os = "linux")]
#[test]
fn at_normal_the_writer_starts_writing_the_wal_back_as_commits_add_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let (mut writer, reader) = open(dir.path(), Durability::Normal).unwrap();
    let wal = writer.checkpointer.as_ref().unwrap().wal.clone();
    // 100 rows of about a page each: some 400 KiB of frames a transaction.
    let mut n = 0;
    while n < 1000 {
        commit_rows(&mut writer, "run_wb", n, 100);
        n += 100;
    }
    let started = wal.written_back.load(Ordering::Relaxed);
    assert!(started >= 3 << 20, "writeback was started for {started} bytes");
    assert_eq!(count_rows(&reader, "run_wb") as u64, n);

    // A transaction committed now never starts it on its (the caller's) thread, though
    // more than a mebibyte of frames is committed so.
    let mut now = 0;
    for _ in 0..600 {
        let before = wal.written_back.load(Ordering::Relaxed);
        match writer.transaction_if_immediate(&Scope::NONE, &mut |tx| insert_rows(tx, "run_wb", n, 1)) {
            Some(done) => {
                done.unwrap();
                now += 1;
                assert_eq!(wal.written_back.load(Ordering::Relaxed), before);
            }
            None => commit_rows(&mut writer, "run_wb", n, 1),
        }
        n += 1;
    }
    assert!(now > 300, "{now} transactions were committed now");
    assert_eq!(count_rows(&reader, "run_wb") as u64, n);
}

#[test]
fn at_normal_a_thread_of_its_own_checkpoints_and_the_wal_stays_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let (db, wal) = (
        dir.path().join("events/events.db"),
        dir.path().join("events/events.db-wal"),
    );
    let (mut writer, reader) = open(dir.path(), Durability::Normal).unwrap();
    // Past the size at which the checkpoint thread is woken, but far below the inline one.
    let mut n = 0;
    while n < 2 * CHECKPOINT_AT as u64 {
        commit_rows(&mut writer, "run_ckpt", n, 100);
        n += 100;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while file_len(&db) < 1 << 20 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        file_len(&db) >= 1 << 20,
        "nothing was checkpointed: the database holds {} bytes",
        file_len(&db)
    );
    // Commits without a pause, to three times the inline size: the WAL starts over instead of
    // growing, passing the inline size by one transaction (100 rows, 2 pages each at most).
    let frame = 4096 + 24;
    let bound = (CHECKPOINT_INLINE_AT as u64 + 200) * frame + 32;
    let mut largest = 0;
    while n < 3 * CHECKPOINT_INLINE_AT as u64 {
        commit_rows(&mut writer, "run_ckpt", n, 100);
        n += 100;
        largest = largest.max(file_len(&wal));
    }
    assert!(largest <= bound, "the WAL grew to {largest} bytes (bound {bound})");
    assert_eq!(reader.last_sequence("run_ckpt").unwrap(), n);
    assert_eq!(count_rows(&reader, "run_ckpt") as u64, n);
    // Closing joins the thread; the last connection out removes the WAL.
    drop(writer);
    drop(reader);
    assert!(!wal.exists());
}

#[test]
fn a_data_directory_too_long_for_sqlite_is_refused_saying_so_before_anything_is_created() {
    let root = tempfile::tempdir().unwrap();
    let base = root.path().canonicalize().unwrap();
    // The store is `<data dir>/events/events.db`: 17 bytes past the data directory.
    let fits = MAX_DATABASE_PATH - 17 - base.as_os_str().len() - 1;
    let dir_of = |n: usize| {
        let name = "d".repeat(n);
        let mut d = base.clone();
        for part in name.as_bytes().chunks(200) {
            d.push(std::str::from_utf8(part).unwrap());
        }
        d
    };
    // Each 200-byte component adds a separator: aim the total at the limit exactly.
    let mut n = fits;
    while dir_of(n).join("events/events.db").as_os_str().len() > MAX_DATABASE_PATH {
        n -= 1;
    }
    let ok = dir_of(n);
    assert_eq!(ok.join("events/events.db").as_os_str().len(), MAX_DATABASE_PATH);
    std::fs::create_dir_all(&ok).unwrap();
    open(&ok, Durability::Normal).map(drop).unwrap();
    let long = dir_of(n + 1);
    std::fs::create_dir_all(&long).unwrap();
    let err = open(&long, Durability::Normal).map(drop).unwrap_err();
    assert_eq!(err.code(), "WORLD_PATH", "{err}");
    assert!(err.to_string().contains("SQLite opens at most 504"), "{err}");
    assert!(!long.join("events").exists());
    assert_eq!(open_read_only(&long).map(drop).unwrap_err().code(), "WORLD_PATH");
    // Predicted for a directory that does not exist yet, before it is created.
    assert!(check_data_dir_length(&dir_of(n)).is_ok());
    let missing = dir_of(n + 1).join("x");
    assert_eq!(check_data_dir_length(&missing).unwrap_err().code(), "WORLD_PATH");
    let fresh = root.path().join("fresh").join("f".repeat(100));
    assert!(check_data_dir_length(&fresh).is_ok());
    // A `..` after a directory that does not exist yet undoes it.
    let dotted = dir_of(n).join("missing").join("..");
    assert!(check_data_dir_length(&dotted).is_ok());
    assert_eq!(
        check_data_dir_length(&dir_of(n).join("missing/../y"))
            .unwrap_err()
            .code(),
        "WORLD_PATH"
    );
}

#[test]
fn a_file_uri_escapes_what_a_uri_would_read_as_its_own() {
    assert_eq!(
        file_uri(Path::new("/a b/c?d#e%f/events.db"), "immutable=1"),
        "file:/a%20b/c%3Fd%23e%25f/events.db?immutable=1"
    );
    // Opened as such, the store at an odd path reads.
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("odd ?#% name");
    let (mut writer, _) = open(&dir, Durability::Normal).unwrap();
    commit_rows(&mut writer, "run_u", 0, 2);
    drop(writer);
    let db = dir.join("events/events.db");
    let conn = connect(&db, Access::Immutable).unwrap();
    assert_eq!(last_sequence(&conn, "run_u").unwrap(), 2);
}

#[test]
fn something_else_where_a_file_of_the_store_belongs_is_refused_saying_what_and_where() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), Durability::Normal).unwrap());
    // A directory where the WAL file belongs: SQLite would say only "unable to open database
    // file".
    let wal = dir.path().join("events/events.db-wal");
    std::fs::create_dir(&wal).unwrap();
    let err = open(dir.path(), Durability::Normal).map(drop).unwrap_err();
    assert_eq!(err.code(), "WORLD_PATH", "{err}");
    assert!(err.to_string().contains(&*wal.to_string_lossy()), "{err}");
    assert!(err.to_string().contains("is a directory"), "{err}");

    // And the database itself a directory.
    let other = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(other.path().join("events/events.db")).unwrap();
    let err = open(other.path(), Durability::Normal).map(drop).unwrap_err();
    assert_eq!(err.code(), "WORLD_PATH", "{err}");
    assert!(err.to_string().contains("is a directory"), "{err}");
}

#[cfg(unix)]
#[test]
fn a_writer_whose_files_were_deleted_while_open_refuses_to_write() {
    for deleted in ["the data directory", "events.db-shm", "events.db-wal", "events.db"] {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("world");
        let (mut writer, _reader) = open(&dir, Durability::Normal).unwrap();
        commit_rows(&mut writer, "run_d", 0, 1);
        assert_eq!(_reader.last_sequence("run_d").unwrap(), 1); // pools a connection
        match deleted {
            "the data directory" => std::fs::remove_dir_all(&dir).unwrap(),
            file => std::fs::remove_file(dir.join("events").join(file)).unwrap(),
        }
        // A reader of the world takes no new connection to whatever is at the path now.
        if deleted == "the data directory" {
            drop(open(&dir, Durability::Normal).unwrap());
            // Not even through a connection it pooled before (which reads the deleted store).
            let err = _reader.last_sequence("run_d").unwrap_err();
            assert!(err.to_string().contains("deleted, moved or replaced"), "{err}");
        }
        let err = writer.transaction(&Scope::NONE, &mut |_| Ok(())).unwrap_err();
        assert_eq!(err.code(), "WORLD_IO", "{deleted}: {err}");
        assert!(
            err.to_string()
                .contains("deleted, moved or replaced while this world had it open"),
            "{deleted}: {err}"
        );
        // Nothing is held: a fresh store at the path takes the write lock at once. (This
        // process's SQLite keeps sharing the deleted `-shm` among its connections to the same
        // database, and a world opened on it here is refused too.)
        match deleted {
            "events.db" => {
                let (mut other, _) = open(&dir, Durability::Normal).unwrap();
                other.transaction(&Scope::NONE, &mut |_| Ok(())).unwrap();
            }
            "events.db-shm" => assert_eq!(open(&dir, Durability::Normal).map(drop).unwrap_err().code(), "WORLD_IO"),
            _ => {}
        }
    }
}

#[cfg(unix)]
#[test]
fn a_writer_whose_wal_was_deleted_copies_it_into_the_database_before_refusing() {
    for durability in [Durability::Full, Durability::Normal] {
        let dir = tempfile::tempdir().unwrap();
        let (mut writer, reader) = open(dir.path(), durability).unwrap();
        commit_rows(&mut writer, "run_w", 0, 3);
        std::fs::remove_file(dir.path().join("events/events.db-wal")).unwrap();
        let err = writer
            .transaction(&Scope::NONE, &mut |tx| insert_rows(tx, "run_w", 3, 1))
            .unwrap_err();
        assert_eq!(err.code(), "WORLD_IO", "{err}");
        assert_eq!(writer.damage, Some((Damage::Rescued, WAL)));
        drop(reader);
        drop(writer);
        // The database file alone holds the three rows: nothing is left in any WAL.
        let db = rusqlite::Connection::open(dir.path().join("events/events.db")).unwrap();
        let n: i64 = db.query_row("SELECT count(*) FROM events", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 3, "{durability:?}");
    }
}

/// Whether this process holds a lock on bytes `start..start + len` of `path`, as another
/// process sees it. Asked from a child: a descriptor opened and closed here to ask would
/// itself drop every POSIX lock this process holds on the file.
#[cfg(target_os = "linux")]
fn locked_by_this_process(path: &Path, start: i64, len: i64) -> bool {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: the child calls only async-signal-safe functions (open, fcntl, _exit) before
    // it exits; the parent waits for it.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0);
        if pid == 0 {
            let fd = libc::open(c_path.as_ptr(), libc::O_RDWR);
            let mut fl: libc::flock = std::mem::zeroed();
            fl.l_type = libc::F_WRLCK as libc::c_short;
            fl.l_whence = libc::SEEK_SET as libc::c_short;
            fl.l_start = start;
            fl.l_len = len;
            let code = if fd < 0 || libc::fcntl(fd, libc::F_GETLK, &mut fl) != 0 {
                2
            } else if fl.l_type == libc::F_UNLCK as libc::c_short {
                0
            } else {
                1
            };
            libc::_exit(code);
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        match libc::WEXITSTATUS(status) {
            0 => false,
            1 => true,
            _ => panic!("could not ask about the locks on {}", path.display()),
        }
    }
}

#[cfg(target_os = "linux")]
#[test]
fn closing_a_writer_leaves_the_locks_of_other_connections_to_the_same_store() {
    let dir = tempfile::tempdir().unwrap();
    let (first, _) = open(dir.path(), Durability::Normal).unwrap();
    let (mut second, _) = open(dir.path(), Durability::Normal).unwrap();
    commit_rows(&mut second, "run_l", 0, 1);
    let shm = dir.path().join("events/events.db-shm");
    // Every WAL connection holds a shared lock on the -shm's "DMS" byte (offset 128 of the
    // locking region at 120) while open: the sign to others that it is in use.
    assert!(locked_by_this_process(&shm, 128, 1));
    drop(first);
    assert!(
        locked_by_this_process(&shm, 128, 1),
        "the second writer's lock went with the first"
    );
    commit_rows(&mut second, "run_l", 1, 1);
}

#[cfg(unix)]
#[test]
fn a_store_whose_database_is_a_symlink_opens_and_writes() {
    let root = tempfile::tempdir().unwrap();
    let target = root.path().join("elsewhere");
    std::fs::create_dir_all(&target).unwrap();
    drop(open(&target, Durability::Normal).unwrap());
    let dir = root.path().join("world");
    std::fs::create_dir_all(dir.join("events")).unwrap();
    std::os::unix::fs::symlink(target.join("events/events.db"), dir.join("events/events.db")).unwrap();
    let (mut writer, _) = open(&dir, Durability::Normal).unwrap();
    commit_rows(&mut writer, "run_s", 0, 2);
    // SQLite keeps the WAL beside the real path too: its writeback is started there.
    #[cfg(target_os = "linux")]
    {
        let mut n = 2;
        while n < 1000 {
            commit_rows(&mut writer, "run_s", n, 100);
            n += 100;
        }
        let wal = &writer.checkpointer.as_ref().unwrap().wal;
        let started = wal.written_back.load(Ordering::Relaxed);
        assert!(started >= 3 << 20, "writeback was started for {started} bytes");
    }
}

#[test]
fn the_store_files_see_the_wal_or_shm_deleted_or_replaced_through_their_watch() {
    for (name, how) in [
        ("events.db-wal", "delete"),
        ("events.db-shm", "delete"),
        ("events.db-wal", "replace"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (mut writer, _reader) = open(dir.path(), Durability::Full).unwrap();
        commit_rows(&mut writer, "run_f", 0, 1);
        let files = writer.files.clone();
        assert_eq!(files.changed(), None);
        let path = dir.path().join("events").join(name);
        match how {
            "delete" => std::fs::remove_file(&path).unwrap(),
            _ => {
                std::fs::rename(&path, dir.path().join("aside")).unwrap();
                std::fs::write(&path, b"").unwrap();
            }
        }
        let want = if name.ends_with("wal") { WAL } else { 1 };
        assert_eq!(files.changed(), Some(want), "{name} {how}");
        // And it stays found.
        assert_eq!(files.changed(), Some(want), "{name} {how}");
    }
}
