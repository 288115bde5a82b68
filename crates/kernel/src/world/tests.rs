//! A world's threads: call order, group commits, close, read-only worlds and the thread limit.

use super::threads::BACKLOG_MAX;
use super::*;
use crate::events;
use crate::events::AppendRequest;
use crate::store::sqlite::Durability;
use crate::vocabulary::{testing::Counting, Materializer};
use crossbeam_channel::Sender;
use crossbeam_channel::{unbounded, Receiver};
use serde_json::Value;
use std::time::Duration;

/// A completer that hands results to the test over a channel.
struct ChannelCompleter(Sender<(Ticket, Result<Output>)>);

impl Completer for ChannelCompleter {
    fn complete(&self, done: Vec<(Ticket, Result<Output>)>) {
        for d in done {
            let _ = self.0.send(d);
        }
    }
}

type Done = Receiver<(Ticket, Result<Output>)>;

fn channel() -> (Arc<dyn Completer>, Done) {
    let (tx, rx) = unbounded();
    (Arc::new(ChannelCompleter(tx)), rx)
}

fn json_of(out: Result<Output>) -> Value {
    match out.unwrap() {
        Output::Json(s) => serde_json::from_str(&s).unwrap(),
        other => panic!("expected JSON, got {other:?}"),
    }
}

fn append(run: &str, i: usize) -> AppendRequest {
    AppendRequest {
        strings: Vec::new(),
        run_id: run.into(),
        event_type: "StepStarted".into(),
        payload_json: format!("{{\"stepPath\":\"s{i}\"}}"),
        key: None,
        draft: None,
        expected_sequence: None,
        index: Vec::new(),
    }
}

/// The committed envelopes of `run` after `after` (at most `limit`), read straight from the store.
fn envelopes(world: &World, run: &str, after: u64, limit: Option<u64>) -> Vec<Value> {
    let mut out = Vec::new();
    world
        .reader()
        .envelopes(run, after, limit, &mut |e| {
            out.push(serde_json::from_str(e).unwrap());
            Ok(())
        })
        .unwrap();
    out
}

/// Another connection to the world's store at `dir`, holding its write lock until it rolls back.
fn hold_write_lock(dir: &Path) -> rusqlite::Connection {
    let holder = rusqlite::Connection::open(dir.join("events/events.db")).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    holder
}

fn wait_all(rx: &Done, n: usize) -> Vec<(Ticket, Result<Output>)> {
    (0..n)
        .map(|_| rx.recv_timeout(std::time::Duration::from_secs(30)).expect("completion"))
        .collect()
}

/// A materializer that counts rows and snapshots every 10,000 events.
fn fold() -> Arc<dyn Materializer> {
    Arc::new(Counting(10_000))
}

#[test]
fn appends_commit_in_call_order_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (c, rx) = channel();
    let world = World::open_local(dir.path(), Durability::Full, fold(), c).unwrap();
    assert!(world.commits_quickly());
    for i in 0..500 {
        world
            .append(i as u64, append(if i % 3 == 0 { "run_x" } else { "run_y" }, i))
            .unwrap();
    }
    world.close(9999).unwrap();
    let done = wait_all(&rx, 501);
    let mut by_ticket: Vec<_> = done.into_iter().filter(|(t, _)| *t != 9999).collect();
    by_ticket.sort_by_key(|(t, _)| *t);
    let mut last = std::collections::HashMap::new();
    for (t, out) in by_ticket {
        let env = json_of(out);
        let run = env["runId"].as_str().unwrap().to_string();
        let seq = env["sequence"].as_u64().unwrap();
        let prev = last.insert(run, seq).unwrap_or(0);
        assert_eq!(seq, prev + 1, "ticket {t}: call order is sequence order");
    }
    assert!(world.append(1, append("run_x", 0)).unwrap_err().code() == "WORLD_CLOSED");

    let (c, _rx) = channel();
    let world = World::open_local(dir.path(), Durability::Normal, fold(), c).unwrap();
    let events = envelopes(&world, "run_x", 0, None);
    assert_eq!(events.len(), 167);
    events::shape::check_log(&events).unwrap();
    let page = envelopes(&world, "run_x", 160, Some(3));
    let seqs: Vec<u64> = page.iter().map(|e| e["sequence"].as_u64().unwrap()).collect();
    assert_eq!(seqs, vec![161, 162, 163]);
}

/// Two worlds on one store each append 400 events to one run at once: all 800 commit, densely.
/// Returns the worlds, still open.
fn two_worlds_stay_dense(a: World, rx1: &Done, b: World, rx2: &Done) -> (World, World) {
    let ta = std::thread::spawn(move || {
        for i in 0..400 {
            a.append(i, append("run_shared", i as usize)).unwrap();
        }
        a
    });
    for i in 0..400 {
        b.append(i, append("run_shared", i as usize)).unwrap();
    }
    let a = ta.join().unwrap();
    assert!(wait_all(rx1, 400).into_iter().all(|(_, o)| o.is_ok()));
    assert!(wait_all(rx2, 400).into_iter().all(|(_, o)| o.is_ok()));
    let list = envelopes(&a, "run_shared", 0, None);
    assert_eq!(list.len(), 800);
    events::shape::check_log(&list).unwrap();
    (a, b)
}

#[test]
fn two_worlds_on_one_directory_stay_dense() {
    let dir = tempfile::tempdir().unwrap();
    let (c1, rx1) = channel();
    let (c2, rx2) = channel();
    let a = World::open_local(dir.path(), Durability::Normal, fold(), c1).unwrap();
    let b = World::open_local(dir.path(), Durability::Normal, fold(), c2).unwrap();
    two_worlds_stay_dense(a, &rx1, b, &rx2);
}

#[test]
fn virtual_world_keeps_the_same_rules() {
    let (c, rx) = channel();
    let world = World::open_virtual(fold(), c).unwrap();
    world.append(1, append("run_v", 1)).unwrap();
    assert_eq!(json_of(wait_all(&rx, 1).remove(0).1)["sequence"], 1);
    // With nothing in flight, a small payload is prepared on the caller's thread: its
    // validation error returns at once.
    let invalid = || AppendRequest {
        strings: Vec::new(),
        run_id: "run_v".into(),
        event_type: "sample.step".into(),
        payload_json: "{}".into(),
        key: None,
        draft: None,
        expected_sequence: None,
        index: Vec::new(),
    };
    assert_eq!(world.append(2, invalid()).unwrap_err().code(), "EVENT_VALIDATION");
    // Too large to prepare here, the append goes through the prep thread: its error arrives
    // through the completer, and the refused appends consume no sequence.
    let large_invalid = AppendRequest {
        strings: Vec::new(),
        run_id: "run_v".into(),
        event_type: "sample.step".into(),
        payload_json: format!("{{\"pad\":\"{}\"}}", "x".repeat(INLINE_PREP_MAX)),
        key: None,
        draft: None,
        expected_sequence: None,
        index: Vec::new(),
    };
    world.append(5, large_invalid).unwrap();
    // While the large one is in flight this one goes through the prep thread too; if the prep
    // thread has already refused it, nothing is in flight and it is refused here, at once.
    let at_once = match world.append(6, invalid()) {
        Ok(()) => false,
        Err(e) => {
            assert_eq!(e.code(), "EVENT_VALIDATION");
            true
        }
    };
    world.append(3, append("run_v", 3)).unwrap();
    let mut done = wait_all(&rx, if at_once { 2 } else { 3 });
    done.sort_by_key(|(t, _)| *t);
    assert_eq!(
        json_of(done.remove(0).1)["sequence"],
        2,
        "the refused appends consumed no sequence"
    );
    for (_, refused) in done {
        assert_eq!(refused.unwrap_err().code(), "EVENT_VALIDATION");
    }
    assert_eq!(world.append(4, append("bad id", 0)).unwrap_err().code(), "WORLD_PATH");
}

#[test]
fn call_order_holds_when_large_and_small_payloads_mix() {
    let (c, rx) = channel();
    let world = World::open_virtual(fold(), c).unwrap();
    let n = 300u64;
    for i in 0..n {
        let pad = if i % 7 == 0 {
            "y".repeat(INLINE_PREP_MAX + 1)
        } else {
            String::new()
        };
        let req = AppendRequest {
            strings: Vec::new(),
            run_id: "run_mix".into(),
            event_type: "StepStarted".into(),
            payload_json: format!("{{\"stepPath\":\"s{i}\",\"pad\":\"{pad}\"}}"),
            key: None,
            draft: None,
            expected_sequence: None,
            index: Vec::new(),
        };
        world.append(i, req).unwrap();
    }
    let mut done = wait_all(&rx, n as usize);
    done.sort_by_key(|(t, _)| *t);
    for (t, out) in done {
        let env = json_of(out);
        assert_eq!(env["sequence"], t + 1, "ticket {t}");
        assert_eq!(env["payload"]["stepPath"], format!("s{t}"));
    }
}

/// The world's close lets go of the locks it holds and makes a taker still waiting give up; a
/// release afterwards resolves (the lock is already free) rather than failing WORLD_CLOSED.
#[test]
fn close_lets_go_of_the_worlds_locks_and_a_release_after_it_resolves() {
    let dir = tempfile::tempdir().unwrap();
    for local in [true, false] {
        let (c, rx) = channel();
        let world = if local {
            World::open_local(dir.path(), Durability::Normal, fold(), c).unwrap()
        } else {
            World::open_virtual(fold(), c).unwrap()
        };
        world.acquire_lock(1, "run", "run_c", Duration::ZERO).unwrap();
        let held = json_of(wait_all(&rx, 1).pop().unwrap().1);
        let token = held["token"].as_str().unwrap().to_string();
        // A taker waiting for a lock the world holds itself.
        world.acquire_lock(2, "run", "run_c", Duration::from_secs(10)).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let started = std::time::Instant::now();
        world.close(3).unwrap();
        let mut done = wait_all(&rx, 2);
        done.sort_by_key(|(t, _)| *t);
        assert!(started.elapsed() < Duration::from_secs(2));
        let mut done = done.into_iter();
        assert_eq!(done.next().unwrap().1.unwrap_err().code(), "WORLD_CLOSED");
        assert!(done.next().unwrap().1.is_ok());

        world.release_lock(4, "run:run_c".into(), token.clone()).unwrap();
        assert!(matches!(wait_all(&rx, 1).pop().unwrap().1, Ok(Output::Unit)));
        assert_eq!(
            world
                .acquire_lock(5, "run", "run_c", Duration::ZERO)
                .unwrap_err()
                .code(),
            "WORLD_CLOSED"
        );
        if local {
            // Free for another world at once.
            let (c2, rx2) = channel();
            let other = World::open_local(dir.path(), Durability::Normal, fold(), c2).unwrap();
            other.acquire_lock(6, "run", "run_c", Duration::ZERO).unwrap();
            assert_ne!(json_of(wait_all(&rx2, 1).pop().unwrap().1)["token"], token.as_str());
            // The closed world's release is still a no-op, not a release of the new owner's lock.
            world.release_lock(7, "run:run_c".into(), token.clone()).unwrap();
            assert!(wait_all(&rx, 1).pop().unwrap().1.is_ok());
            other.acquire_lock(8, "run", "run_c", Duration::ZERO).unwrap();
            let still_held = wait_all(&rx2, 1).pop().unwrap().1;
            assert_eq!(still_held.unwrap_err().code(), "RUN_LOCKED");
        }
    }
}

#[test]
fn close_lets_go_of_a_lock_only_after_the_appends_queued_under_it_have_committed() {
    use crate::locks::Locks;
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let (c, rx) = channel();
    let world = World::open_local(dir.path(), Durability::Normal, fold(), c).unwrap();
    world.acquire_lock(1, "run", "run_f", Duration::ZERO).unwrap();
    wait_all(&rx, 1);
    let n = 20_000;
    for i in 0..n {
        world.append(10 + i as u64, append("run_f", i)).unwrap();
    }
    world.close(2).unwrap();
    // Another taker of the fence (another process, as far as the lock knows) polls for it: when
    // it gets it, every append made under the lock must be in the log.
    let other = Locks::new(crate::locks::local::LocalLocks::open(dir.path()).unwrap());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match other.acquire("run:run_f", Duration::ZERO) {
            Ok(_) => break,
            Err(e) => assert_eq!(e.code(), "RUN_LOCKED", "{e}"),
        }
        assert!(std::time::Instant::now() < deadline, "the lock was never let go of");
        std::thread::sleep(Duration::from_micros(200));
    }
    // Read as that other process would, with a connection of its own: the closing world's reader
    // may already have let go of the store's files.
    let store = rusqlite::Connection::open(dir.path().join("events/events.db")).unwrap();
    let last: i64 = store
        .query_row("SELECT max(sequence) FROM events WHERE run_id = 'run_f'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(last, n as i64);
    wait_all(&rx, n + 1);
}

/// A world opened read-only refuses, at once, an append, a lock, a release and a manifest write
/// (tickets 3 to 6).
fn assert_refuses_writes(reader: &World) {
    let refused = reader.append(3, append("run_r", 2)).unwrap_err();
    assert!(
        matches!(&refused, WorldError::Path { message } if message.contains("was opened read-only")),
        "{refused:?}"
    );
    assert!(matches!(
        reader.acquire_lock(4, "run", "run_r", std::time::Duration::ZERO),
        Err(WorldError::Path { .. })
    ));
    assert!(matches!(
        reader.write_outer_loop(5, "{}".into()),
        Err(WorldError::Path { .. })
    ));
    assert!(matches!(
        reader.release_lock(6, "run_r".into(), "t".into()),
        Err(WorldError::Path { .. })
    ));
}

#[test]
fn a_read_only_world_reads_what_others_commit_and_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (c, rx) = channel();
    let writer = World::open_local(dir.path(), Durability::Full, fold(), c.clone()).unwrap();
    writer.append(1, append("run_r", 0)).unwrap();
    wait_all(&rx, 1);
    let reader = World::open_local_read_only(dir.path(), fold(), c.clone()).unwrap();
    assert_eq!(envelopes(&reader, "run_r", 0, None).len(), 1);
    // A commit after the read-only world opened is seen by its next read.
    writer.append(2, append("run_r", 1)).unwrap();
    wait_all(&rx, 1);
    assert_eq!(envelopes(&reader, "run_r", 0, None).len(), 2);

    assert_refuses_writes(&reader);
    reader.close(7).unwrap();
    writer.close(8).unwrap();
    wait_all(&rx, 2);
    // Once the writer has closed (its checkpoint emptied the WAL), a fresh read-only open reads all.
    let again = World::open_local_read_only(dir.path(), fold(), c).unwrap();
    assert_eq!(envelopes(&again, "run_r", 0, None).len(), 2);
}

#[test]
fn a_read_only_open_needs_a_world_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (c, _rx) = channel();
    let missing = dir.path().join("nowhere");
    for at in [missing.as_path(), dir.path()] {
        let err = World::open_local_read_only(at, fold(), c.clone())
            .err()
            .expect("refused");
        assert!(
            matches!(&err, WorldError::Path { message } if message.starts_with("no world at ")),
            "{err:?}"
        );
    }
    assert!(!missing.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    // An empty database (a crash between creating the file and its first migration) is no world yet.
    std::fs::create_dir(dir.path().join("events")).unwrap();
    std::fs::write(dir.path().join("events/events.db"), b"").unwrap();
    let err = World::open_local_read_only(dir.path(), fold(), c)
        .err()
        .expect("refused");
    assert!(
        matches!(&err, WorldError::Path { message } if message.contains("holds no world yet")),
        "{err:?}"
    );
}

/// A keyed append refused for its payload is answered by a read of its key, never by the writer:
/// it does not wait for another process's write lock (nor wait out the busy timeout and then
/// fail with WORLD_IO), whether it was prepared on the caller's thread or the prep thread.
#[test]
fn a_refused_keyed_append_does_not_wait_for_the_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let (c, rx) = channel();
    let world = World::open_local(dir.path(), Durability::Normal, fold(), c).unwrap();
    let holder = hold_write_lock(dir.path());
    for (ticket, pad) in [(1, 0), (2, 20_000)] {
        let mut r = append("run_l", 0);
        r.event_type = "keyed.usage".into();
        r.key = Some(format!("k{ticket}"));
        r.payload_json = format!(
            r#"{{"runId":"run_c","pad":"{}","usage":{{"inputTokens":1,"outputTokens":1,"cachedInputTokens":2,"reasoningTokens":0}}}}"#,
            "p".repeat(pad)
        );
        world.append(ticket, r).unwrap();
        let (t, out) = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("answered while the lock is held");
        assert_eq!(t, ticket);
        assert!(
            matches!(out, Err(WorldError::Validation { ref path, .. }) if path == "payload.usage.cachedInputTokens"),
            "{out:?}"
        );
    }
    holder.execute_batch("ROLLBACK").unwrap();
    world.close(9).unwrap();
    wait_all(&rx, 1);
}

/// Under load too, a small append is prepared on the caller's thread and sent straight to the
/// writer once the prep thread has nothing queued: an invalid one is refused right there (the
/// prep thread answers a larger one through the completer), and the valid ones commit in call
/// order, behind the large one the prep thread had.
#[test]
fn under_load_a_small_append_is_prepared_on_the_callers_thread_and_commits_in_call_order() {
    let dir = tempfile::tempdir().unwrap();
    let (c, rx) = channel();
    let world = World::open_local(dir.path(), Durability::Normal, fold(), c).unwrap();
    // The writer waits for another connection's write lock, so what it is sent stays unsettled.
    let holder = hold_write_lock(dir.path());
    let mut large = append("run_u", 0);
    large.payload_json = format!("{{\"stepPath\":\"{}\"}}", "l".repeat(INLINE_PREP_MAX));
    world.append(0, large).unwrap();
    for i in 1..3 {
        world.append(i as Ticket, append("run_u", i)).unwrap();
    }
    // The prep thread passes the large one on (it waits for the writer only past its backlog).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while world
        .inner
        .submit
        .lock()
        .unwrap()
        .as_ref()
        .unwrap()
        .prep_pending
        .load(Ordering::Acquire)
        > 0
    {
        assert!(std::time::Instant::now() < deadline, "the prep thread kept its appends");
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut bad = append("run_u", 3);
    bad.payload_json = "[1]".into();
    let err = world.append(3, bad).unwrap_err();
    assert_eq!(err.code(), "EVENT_VALIDATION", "{err}");
    // A larger one goes to the prep thread, which answers it.
    let mut larger = append("run_u", 6);
    larger.payload_json = format!("[{}1]", "1,".repeat(INLINE_UNDER_LOAD_MAX / 2));
    world.append(6, larger).unwrap();
    let (t, out) = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("answered by the prep thread");
    assert_eq!(t, 6);
    assert_eq!(out.unwrap_err().code(), "EVENT_VALIDATION");
    for i in 4..6 {
        world.append(i as Ticket, append("run_u", i)).unwrap();
    }
    assert!(rx.try_recv().is_err(), "nothing settles while the lock is held");
    holder.execute_batch("ROLLBACK").unwrap();
    let done = wait_all(&rx, 5);
    let order: Vec<(Ticket, u64)> = done
        .into_iter()
        .map(|(t, out)| (t, json_of(out)["sequence"].as_u64().unwrap()))
        .collect();
    assert_eq!(order, [(0, 1), (1, 2), (2, 3), (4, 4), (5, 5)]);
    world.close(9).unwrap();
    wait_all(&rx, 1);
}

/// A keyed append refused for its payload settles before a close called after it, as every append
/// does: it is answered in call order by the prep thread (it was once answered on the shared pool,
/// and a close could resolve first).
#[test]
fn a_refused_keyed_append_settles_before_a_close_called_after_it() {
    for _ in 0..50 {
        let (c, rx) = channel();
        let world = World::open_virtual(fold(), c).unwrap();
        let mut r = append("run_c", 0);
        r.event_type = "note".into();
        r.key = Some("k".into());
        r.payload_json = r#"{"usage":{"costUsd":1}}"#.into();
        world.append(1, r).unwrap();
        world.close(2).unwrap();
        let order: Vec<Ticket> = wait_all(&rx, 2).into_iter().map(|(t, _)| t).collect();
        assert_eq!(order, [1, 2]);
    }
}

#[test]
fn at_the_thread_limit_opening_a_world_fails_with_world_io_and_works_once_threads_can_start() {
    use crate::runtime::fail_thread_starts;
    let dir = tempfile::tempdir().unwrap();
    // At `normal`: the checkpoint thread, then the prep and writer threads; at `full`, no
    // checkpoint thread.
    for (durability, starts) in [(Durability::Normal, 3), (Durability::Full, 2)] {
        for ok in 0..starts {
            let (c, _rx) = channel();
            fail_thread_starts(ok, 1);
            let err = match World::open_local(dir.path(), durability, fold(), c) {
                Err(e) => e,
                Ok(_) => panic!("{durability:?}: opened with start {ok} failing"),
            };
            assert_eq!(err.code(), "WORLD_IO", "{err}");
            assert!(err.to_string().contains("Resource temporarily unavailable"), "{err}");
        }
    }
    let (c, _rx) = channel();
    fail_thread_starts(1, 1);
    assert_eq!(World::open_virtual(fold(), c).err().unwrap().code(), "WORLD_IO");

    // Once threads can start again, the world opens and works, and a lock's thread that cannot
    // start fails that acquire alone, and a close still completes.
    fail_thread_starts(0, 0);
    let (c, rx) = channel();
    let world = World::open_local(dir.path(), Durability::Full, fold(), c).unwrap();
    world.append(1, append("run_t", 0)).unwrap();
    assert_eq!(json_of(wait_all(&rx, 1).pop().unwrap().1)["sequence"], 1);
    fail_thread_starts(0, 1);
    let err = world
        .acquire_lock(2, "run", "run_t", std::time::Duration::ZERO)
        .unwrap_err();
    assert_eq!(err.code(), "WORLD_IO", "{err}");
    world
        .acquire_lock(3, "run", "run_t", std::time::Duration::ZERO)
        .unwrap();
    let lock = json_of(wait_all(&rx, 1).pop().unwrap().1);
    assert_eq!(lock["name"], "run:run_t");
    world.close(4).unwrap();
    let (ticket, out) = wait_all(&rx, 1).pop().unwrap();
    assert_eq!(ticket, 4);
    assert!(matches!(out, Ok(Output::Unit)));
    // A second close, which has no writer thread to finish on, starts a thread of its own; when
    // it cannot, it finishes on the caller's.
    fail_thread_starts(0, usize::MAX);
    world.close(5).unwrap();
    let (ticket, out) = rx.try_recv().expect("completed before close() returned");
    assert_eq!(ticket, 5);
    assert!(matches!(out, Ok(Output::Unit)));
    fail_thread_starts(0, 0);
    let stored = crate::store::sqlite::open_read_only(dir.path()).unwrap();
    assert_eq!(stored.last_sequence("run_t").unwrap(), 1);
}

#[test]
fn a_listing_of_runs_folds_again_only_the_streams_that_grew() {
    let dir = tempfile::tempdir().unwrap();
    let (c, rx) = channel();
    let world = World::open_local(dir.path(), Durability::Normal, fold(), c).unwrap();
    let typed = |run: &str, t: &str| AppendRequest {
        event_type: t.into(),
        payload_json: "{}".into(),
        ..append(run, 0)
    };
    world.append(1, typed("run_a", "sample.started")).unwrap();
    world.append(2, typed("run_b", "sample.started")).unwrap();
    wait_all(&rx, 2);
    let statuses = |ticket| {
        world.runs(ticket).unwrap();
        let (_, out) = wait_all(&rx, 1).pop().unwrap();
        json_of(out)
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["runId"].as_str().unwrap().to_string(),
                    r["status"].as_str().unwrap().to_string(),
                )
            })
            .collect::<Vec<_>>()
    };
    let both = |a: &str, b: &str| {
        vec![
            ("run_a".to_string(), a.to_string()),
            ("run_b".to_string(), b.to_string()),
        ]
    };
    assert_eq!(statuses(3), both("running", "running"));
    // A stream that grew is folded again.
    world.append(4, typed("run_a", "sample.completed")).unwrap();
    wait_all(&rx, 1);
    assert_eq!(statuses(5), both("completed", "running"));
    // One that did not is not read again: damaging its stored envelope (which its next fold
    // would report as unreadable) changes nothing in the listing.
    let db = rusqlite::Connection::open(dir.path().join("events/events.db")).unwrap();
    db.execute("UPDATE events SET envelope = 'not json' WHERE run_id = 'run_b'", [])
        .unwrap();
    assert_eq!(statuses(6), both("completed", "running"));
    world.append(7, typed("run_b", "sample.completed")).unwrap();
    wait_all(&rx, 1);
    assert_eq!(statuses(8), both("completed", "unreadable"));
}

/// A completer that says which thread completed each ticket.
struct ThreadCompleter(Sender<(Ticket, Result<Output>, std::thread::ThreadId)>);

impl Completer for ThreadCompleter {
    fn complete(&self, done: Vec<(Ticket, Result<Output>)>) {
        for (t, out) in done {
            let _ = self.0.send((t, out, std::thread::current().id()));
        }
    }
}

type ThreadDone = Receiver<(Ticket, Result<Output>, std::thread::ThreadId)>;

/// A local world whose completions say which thread completed them.
fn world_telling_threads(dir: &Path, durability: Durability) -> (World, ThreadDone) {
    let (tx, rx) = unbounded();
    let world = World::open_local(dir, durability, fold(), Arc::new(ThreadCompleter(tx))).unwrap();
    (world, rx)
}

#[test]
fn an_awaited_append_commits_on_the_callers_thread_only_when_nothing_waits() {
    let here = std::thread::current().id();
    let sequence = |out: Result<Output>| json_of(out)["sequence"].as_u64().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (world, rx) = world_telling_threads(dir.path(), Durability::Normal);

    // Nothing in flight, nothing holding the lock: committed and completed before the call returns.
    world.append_awaited(1, append("run_t", 1)).unwrap();
    let (t, out, by) = rx.try_recv().expect("completed in the call");
    assert_eq!((t, sequence(out), by), (1, 1, here));

    // Behind appends in flight it waits its turn, and commits after them.
    for i in 2..=101 {
        world.append(i, append("run_t", i as usize)).unwrap();
    }
    world.append_awaited(102, append("run_t", 102)).unwrap();
    let mut done: Vec<_> = (0..101)
        .map(|_| rx.recv_timeout(Duration::from_secs(30)).unwrap())
        .collect();
    done.sort_by_key(|(t, _, _)| *t);
    for (t, out, _) in done {
        assert_eq!(sequence(out), t);
    }

    // Another connection holds the write lock: the call returns without waiting for it, and the
    // writer's thread commits the append once the lock is let go.
    let other = hold_write_lock(dir.path());
    world.append_awaited(103, append("run_t", 103)).unwrap();
    assert!(
        rx.try_recv().is_err(),
        "completed while another connection held the lock"
    );
    other.execute_batch("COMMIT").unwrap();
    let (t, out, by) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!((t, sequence(out)), (103, 103));
    assert_ne!(by, here);
    world.close(104).unwrap();
    rx.recv_timeout(Duration::from_secs(30)).unwrap().1.unwrap();

    // At `full` the commit syncs, so it never happens on the caller's thread.
    let dir = tempfile::tempdir().unwrap();
    let (world, rx) = world_telling_threads(dir.path(), Durability::Full);
    world.append_awaited(1, append("run_f", 1)).unwrap();
    let (_, out, by) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(sequence(out), 1);
    assert_ne!(by, here);
    world.close(2).unwrap();
    rx.recv_timeout(Duration::from_secs(30)).unwrap().1.unwrap();
}

/// The prep thread stops once it has handed the writer [`BACKLOG_MAX`] bytes not yet committed:
/// with the writer held up by another connection's write lock, 200 appends of 64 KiB stay mostly
/// with the prep thread (without the limit it passes them all on in milliseconds), and once the
/// lock is let go every one commits, in call order.
#[test]
fn the_prep_thread_runs_at_most_a_few_mebibytes_ahead_of_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let (c, rx) = channel();
    let world = World::open_local(dir.path(), Durability::Normal, fold(), c).unwrap();
    // Create the store's files before another connection opens it.
    world.append(1, append("run_bl", 0)).unwrap();
    wait_all(&rx, 1);
    let holder = hold_write_lock(dir.path());
    let blob = "b".repeat(64 * 1024);
    let n = 200;
    for i in 1..=n {
        let mut r = append("run_bl", i);
        r.payload_json = format!(r#"{{"stepPath":"s{i}","blob":"{blob}"}}"#);
        world.append(1 + i as Ticket, r).unwrap();
    }
    let pending = || {
        let submit = world.inner.submit.lock().unwrap();
        submit.as_ref().unwrap().prep_pending.load(Ordering::Acquire)
    };
    let fits = BACKLOG_MAX / (64 * 1024) + 1;
    std::thread::sleep(Duration::from_millis(500));
    let held = pending();
    assert!(
        held >= n - fits - 1,
        "the prep thread passed on {} of {n} appends",
        n - held
    );
    assert!(rx.try_recv().is_err(), "nothing commits while the lock is held");
    holder.execute_batch("ROLLBACK").unwrap();
    let done = wait_all(&rx, n);
    let tickets: Vec<Ticket> = done.iter().map(|(t, _)| *t).collect();
    assert_eq!(tickets, (2..=n as Ticket + 1).collect::<Vec<_>>());
    assert!(done.into_iter().all(|(_, out)| out.is_ok()));
    assert_eq!(envelopes(&world, "run_bl", 0, None).len(), n + 1);
    assert_eq!(pending(), 0);
    world.close(9999).unwrap();
    wait_all(&rx, 1);
}

/// A `postgres` world in `schema`, or a read-only one.
fn postgres_world(schema: &crate::pg::testing::TestSchema, read_only: bool, c: Arc<dyn Completer>) -> World {
    let options = crate::pg::Options {
        read_only,
        ..schema.options()
    };
    World::open_postgres(options, fold(), c).unwrap()
}

#[test]
fn two_postgres_worlds_on_one_schema_stay_dense() {
    let Some(schema) = crate::pg::testing::test_schema() else {
        return;
    };
    let (c1, rx1) = channel();
    let (c2, rx2) = channel();
    let a = postgres_world(&schema, false, c1);
    let b = postgres_world(&schema, false, c2);
    // Its commits take a round trip: a caller is woken, rather than held waiting in place.
    assert!(!a.commits_quickly());
    let (a, b) = two_worlds_stay_dense(a, &rx1, b, &rx2);
    a.close(1000).unwrap();
    b.close(1001).unwrap();
    wait_all(&rx1, 1);
    wait_all(&rx2, 1);
}

#[test]
fn a_read_only_postgres_world_reads_what_others_commit_and_refuses_writes() {
    let Some(schema) = crate::pg::testing::test_schema() else {
        return;
    };
    let (c, rx) = channel();
    // Before any writer has made the schema, a read-only world says there is no world there, as
    // a read-only local world does for a directory without one.
    let early = postgres_world(&schema, true, c.clone());
    let mut none = Vec::new();
    let err = early
        .reader()
        .envelopes("run_r", 0, None, &mut |e| {
            none.push(e.to_string());
            Ok(())
        })
        .unwrap_err();
    assert_eq!(err.code(), "WORLD_PATH", "{err}");
    assert!(err.to_string().contains(&schema.name), "{err}");

    let writer = postgres_world(&schema, false, c.clone());
    writer.append(1, append("run_r", 0)).unwrap();
    assert!(wait_all(&rx, 1)[0].1.is_ok());
    let reader = postgres_world(&schema, true, c.clone());
    assert_eq!(envelopes(&reader, "run_r", 0, None).len(), 1);
    writer.append(2, append("run_r", 1)).unwrap();
    wait_all(&rx, 1);
    assert_eq!(envelopes(&reader, "run_r", 0, None).len(), 2);
    assert_refuses_writes(&reader);
    reader.close(7).unwrap();
    writer.close(8).unwrap();
    early.close(9).unwrap();
    wait_all(&rx, 3);
}

/// A world keeps a fold snapshot of a run each time it reaches a multiple of its materializer's
/// `snapshot_every` events, taken in the background, and verify holds it against the fold.
fn a_world_keeps_fold_snapshots(world: World, rx: &Done) {
    let every = 10;
    let counting = Counting(every);
    let key = counting.snapshot_key();
    let n = every + 3;
    for i in 0..n {
        world.append(i, append("run_w", i as usize)).unwrap();
    }
    let done = wait_all(rx, n as usize);
    assert!(done.iter().all(|(_, o)| o.is_ok()));
    let snapshots = world.reader().fold_snapshots().expect("this store keeps snapshots");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let kept = loop {
        if let Some(s) = snapshots.snapshot("run_w", &key).unwrap() {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "no snapshot was taken");
        std::thread::sleep(Duration::from_millis(20));
    };
    // Taken at or after the event that reached it: the fold reads the run to its end.
    assert!((every..=n).contains(&kept.sequence), "{}", kept.sequence);
    assert_eq!(kept.state, kept.sequence.to_string());
    // Verify holds the snapshot against the fold of the events, and names one that is not.
    let verify = || crate::verify::verify(&**world.reader(), world.artifacts(), &counting, None, false).unwrap();
    let report = verify();
    assert!(report.ok, "{:?}", report.problems);
    // Under a later sequence, so that it replaces the one kept, and with the run long enough to
    // reach it.
    let forged = crate::store::StoredSnapshot {
        sequence: kept.sequence + 1,
        state: "7".into(),
    };
    snapshots.put_snapshot("run_w", &key, &forged).unwrap();
    for i in 0..2 {
        world.append(n + i, append("run_w", i as usize)).unwrap();
    }
    assert!(wait_all(rx, 2).iter().all(|(_, o)| o.is_ok()));
    let kinds: Vec<&str> = verify().problems.iter().map(|p| p.kind).collect();
    assert_eq!(kinds, ["fold-snapshot"]);
    world.close(u64::MAX).unwrap();
    wait_all(rx, 1);
}

#[test]
fn a_virtual_world_keeps_fold_snapshots() {
    let (c, rx) = channel();
    a_world_keeps_fold_snapshots(World::open_virtual(Arc::new(Counting(10)), c).unwrap(), &rx);
}

#[test]
fn a_postgres_world_keeps_fold_snapshots() {
    let Some(schema) = crate::pg::testing::test_schema() else {
        return;
    };
    let (c, rx) = channel();
    let world = World::open_postgres(schema.options(), Arc::new(Counting(10)), c).unwrap();
    a_world_keeps_fold_snapshots(world, &rx);
}
