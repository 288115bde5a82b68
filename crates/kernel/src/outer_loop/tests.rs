//! Outer-loop manifests: the `inputHash` check, the recovery marker, races and crash leftovers.

use super::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::thread;

/// Another process publishes the first manifest between this write's check and its publishing.
#[test]
fn a_first_manifest_written_by_two_processes_at_once_is_checked_against_the_one_that_won() {
    let dir = tempfile::tempdir().unwrap();
    let loops = OuterLoops::new(local::LocalManifests::open(dir.path()).unwrap());
    let meanwhile = |theirs: &'static str| {
        let mut once = Some(theirs);
        BEFORE_PUBLISHING.with(|h| {
            *h.borrow_mut() = Some(Box::new(move |place: &str| {
                if let Some(text) = once.take() {
                    fs::write(place, text).unwrap();
                }
            }))
        });
    };
    meanwhile(r#"{"inputHash":"sha256:b","outerLoopId":"ol_race"}"#);
    let err = loops
        .write(r#"{"outerLoopId":"ol_race","inputHash":"sha256:a","pendingCycleRunId":"run_a"}"#)
        .unwrap_err();
    assert_eq!(err.code(), "OUTER_LOOP_INPUT_MISMATCH");
    let v: Value = serde_json::from_str(&loops.read("ol_race").unwrap().unwrap()).unwrap();
    assert_eq!(v["inputHash"], "sha256:b");

    // With the same inputHash, the write goes on over the other's, keeping its pending run.
    meanwhile(r#"{"inputHash":"sha256:c","outerLoopId":"ol_same","pendingCycleRunId":"run_other"}"#);
    loops
        .write(r#"{"outerLoopId":"ol_same","inputHash":"sha256:c","maxCycles":3}"#)
        .unwrap();
    BEFORE_PUBLISHING.with(|h| *h.borrow_mut() = None);
    let v: Value = serde_json::from_str(&loops.read("ol_same").unwrap().unwrap()).unwrap();
    assert_eq!(v["maxCycles"], 3);
    assert_eq!(v["pendingCycleRunId"], "run_other");
    let left: Vec<_> = fs::read_dir(dir.path().join("outer-loops"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
}

/// What is at a manifest's path but is no file is named, and a FIFO does not hang the read.
#[test]
fn a_manifest_path_holding_no_file_is_corrupt_and_said_so() {
    let dir = tempfile::tempdir().unwrap();
    let loops = OuterLoops::new(local::LocalManifests::open(dir.path()).unwrap());
    let at = |id: &str| dir.path().join("outer-loops").join(format!("{id}.json"));
    fs::create_dir(at("ol_dir")).unwrap();
    let fifo = std::ffi::CString::new(at("ol_fifo").to_str().unwrap()).unwrap();
    // SAFETY: a valid C string naming a path in a temporary directory.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    for (id, what) in [("ol_dir", "a directory"), ("ol_fifo", "a FIFO")] {
        let err = loops.read(id).unwrap_err();
        assert_eq!(err.code(), "RUNTIME_INTEGRITY");
        assert!(
            err.to_string().ends_with(&format!("{id}.json is {what}, not a file")),
            "{err}"
        );
        let err = loops
            .write(&format!(r#"{{"outerLoopId":"{id}","inputHash":"sha256:a"}}"#))
            .unwrap_err();
        assert_eq!(err.code(), "RUNTIME_INTEGRITY");
    }
}

#[test]
fn a_manifest_larger_than_any_written_is_refused_and_never_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let loops = OuterLoops::new(local::LocalManifests::open(dir.path()).unwrap());
    // A sparse terabyte at a manifest's path: read whole, it took the process's memory.
    let path = dir.path().join("outer-loops/ol_huge.json");
    fs::File::create(&path).unwrap().set_len(1 << 40).unwrap();
    let err = loops.read("ol_huge").unwrap_err();
    assert_eq!(err.code(), "RUNTIME_INTEGRITY");
    assert!(
        err.to_string().contains("ol_huge.json holds 1099511627776 bytes"),
        "{err}"
    );
    // One byte over the limit, in canonical JSON, is refused in both stores and nothing is
    // kept; at the limit it is stored and read back.
    let head = r#"{"goal":{"description":""},"inputHash":"sha256:a","outerLoopId":"ol_big"}"#;
    let over = head.replacen(
        r#":"""#,
        &format!(r#":"{}""#, "x".repeat(MANIFEST_MAX + 1 - head.len())),
        1,
    );
    assert_eq!(over.len(), MANIFEST_MAX + 1);
    let at_limit = over.replacen('x', "", 1);
    for loops in [
        OuterLoops::new(local::LocalManifests::open(dir.path()).unwrap()),
        OuterLoops::new(r#virtual::VirtualManifests::new()),
    ] {
        let err = loops.write(&over).unwrap_err();
        assert_eq!(err.code(), "EVENT_VALIDATION");
        assert!(
            err.to_string().contains("a manifest holds at most 268435456 (256 MiB)"),
            "{err}"
        );
        assert_eq!(loops.read("ol_big").unwrap(), None);
        loops.write(&at_limit).unwrap();
        assert_eq!(loops.read("ol_big").unwrap().unwrap(), at_limit);
    }
}

#[test]
fn input_hash_is_the_loops_identity_and_pending_run_is_kept_until_cleared() {
    let dir = tempfile::tempdir().unwrap();
    for loops in [
        OuterLoops::new(local::LocalManifests::open(dir.path()).unwrap()),
        OuterLoops::new(r#virtual::VirtualManifests::new()),
    ] {
        assert_eq!(loops.read("ol_1").unwrap(), None);
        loops
            .write(r#"{"outerLoopId":"ol_1","inputHash":"sha256:a","maxCycles":5,"cycles":[],"pendingCycleRunId":"run_c1"}"#)
            .unwrap();
        loops
            .write(
                r#"{"outerLoopId":"ol_1","inputHash":"sha256:a","maxCycles":5,"cycles":[{"cycleNumber":1,"runId":"run_c1","status":"completed"}]}"#,
            )
            .unwrap();
        let v: Value = serde_json::from_str(&loops.read("ol_1").unwrap().unwrap()).unwrap();
        assert_eq!(v["pendingCycleRunId"], "run_c1");
        assert_eq!(v["cycles"][0]["cycleNumber"], 1);
        loops
            .write(r#"{"outerLoopId":"ol_1","inputHash":"sha256:a","pendingCycleRunId":null}"#)
            .unwrap();
        let v: Value = serde_json::from_str(&loops.read("ol_1").unwrap().unwrap()).unwrap();
        assert!(v.get("pendingCycleRunId").is_none());
        let err = loops
            .write(r#"{"outerLoopId":"ol_1","inputHash":"sha256:b"}"#)
            .unwrap_err();
        assert_eq!(err.code(), "OUTER_LOOP_INPUT_MISMATCH");
        assert_eq!(
            loops
                .write(r#"{"outerLoopId":"../x","inputHash":"h"}"#)
                .unwrap_err()
                .code(),
            "WORLD_PATH"
        );
        assert_eq!(
            loops.write(r#"{"outerLoopId":"ol_2"}"#).unwrap_err().code(),
            "EVENT_VALIDATION"
        );
    }
}

/// A manifest nested deeper than serde_json's default limit keeps its checks in both stores
/// (the virtual store re-read it with that limit, and took an unreadable one for none).
#[test]
fn a_deep_manifest_keeps_its_input_hash_and_pending_run() {
    let dir = tempfile::tempdir().unwrap();
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    for loops in [
        OuterLoops::new(local::LocalManifests::open(dir.path()).unwrap()),
        OuterLoops::new(r#virtual::VirtualManifests::new()),
    ] {
        loops
            .write(&format!(
                r#"{{"outerLoopId":"ol_d","inputHash":"sha256:a","cycles":[{{"cycleNumber":1,"runId":"run_c1","status":"completed","output":{deep}}}],"pendingCycleRunId":"run_c1"}}"#
            ))
            .unwrap();
        let err = loops
            .write(r#"{"outerLoopId":"ol_d","inputHash":"sha256:b"}"#)
            .unwrap_err();
        assert_eq!(err.code(), "OUTER_LOOP_INPUT_MISMATCH");
        loops.write(r#"{"outerLoopId":"ol_d","inputHash":"sha256:a"}"#).unwrap();
        let v = canonical::parse(&loops.read("ol_d").unwrap().unwrap()).unwrap();
        assert_eq!(v["pendingCycleRunId"], "run_c1");
    }
}

/// The local manifests of `data` plus a second handle on them through a symlink (two worlds of
/// one process on one data directory), and an in-memory store shared by two handles.
fn store_pairs(root: &Path) -> Vec<(Arc<OuterLoops>, Arc<OuterLoops>, Option<PathBuf>)> {
    let data = root.join("data");
    fs::create_dir_all(&data).unwrap();
    let link = root.join("link");
    std::os::unix::fs::symlink(&data, &link).unwrap();
    let memory = Arc::new(OuterLoops::new(r#virtual::VirtualManifests::new()));
    vec![
        (
            Arc::new(OuterLoops::new(local::LocalManifests::open(&data).unwrap())),
            Arc::new(OuterLoops::new(local::LocalManifests::open(&link).unwrap())),
            Some(data.join("outer-loops")),
        ),
        (memory.clone(), memory, None),
    ]
}

#[test]
fn overlapping_writes_of_one_manifest_are_serialized_and_never_torn() {
    const THREADS: usize = 8;
    const WRITES: usize = 12;
    const ROUNDS: usize = 6;
    let root = tempfile::tempdir().unwrap();
    for (a, b, dir) in store_pairs(root.path()) {
        for round in 0..ROUNDS {
            let id = format!("ol_race_{round}");
            let start = Barrier::new(THREADS + 1);
            let done = AtomicBool::new(false);
            // Per thread, in order: (manifest written, what the write returned).
            let outcomes: Vec<Vec<(Value, Result<()>)>> = thread::scope(|s| {
                let reader = s.spawn(|| -> Result<()> {
                    start.wait();
                    // Every read while the writes overlap parses: no torn file is ever published.
                    while !done.load(Ordering::Relaxed) {
                        a.read(&id)?;
                    }
                    Ok(())
                });
                let writers: Vec<_> = (0..THREADS)
                    .map(|t| {
                        let (loops, id, start) = (if t % 2 == 0 { &a } else { &b }, &id, &start);
                        s.spawn(move || {
                            start.wait();
                            (0..WRITES)
                                .map(|i| {
                                    // Alternate the input between the two handles and over time.
                                    let hash = if (t + i) % 2 == 0 { "sha256:a" } else { "sha256:b" };
                                    let run_id = format!("run_{t}_{i}");
                                    let mut m = serde_json::json!({
                                        "outerLoopId": id,
                                        "inputHash": hash,
                                        "cycles": [{"cycleNumber": i + 1, "runId": run_id, "status": "completed"}],
                                        "pad": "x".repeat(16 * 1024),
                                    });
                                    // Every third write sets a pending run; the others keep it.
                                    if i % 3 == 0 {
                                        m["pendingCycleRunId"] = run_id.into();
                                    }
                                    let r = loops.write(&m.to_string());
                                    (m, r)
                                })
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                let outcomes = writers.into_iter().map(|w| w.join().unwrap()).collect();
                done.store(true, Ordering::Relaxed);
                reader.join().unwrap().expect("a read while writes overlap");
                outcomes
            });

            // Each write resolved or was refused for its input, nothing else.
            for (_, r) in outcomes.iter().flatten() {
                if let Err(e) = r {
                    assert_eq!(e.code(), "OUTER_LOOP_INPUT_MISMATCH", "{e}");
                }
            }
            // The first write stored its inputHash; exactly the writes carrying it resolved.
            let mut stored: Map<String, Value> = serde_json::from_str(&a.read(&id).unwrap().unwrap()).unwrap();
            let first_hash = stored["inputHash"].clone();
            for (m, r) in outcomes.iter().flatten() {
                let what = (&m["inputHash"], &m["cycles"][0]["runId"]);
                assert_eq!(
                    r.is_ok(),
                    m["inputHash"] == first_hash,
                    "round {round}: {what:?} gave {r:?}"
                );
            }
            // The stored manifest is one thread's last resolved write (a thread's writes are in
            // order), carrying a pending run a resolved write set: once one is set, later writes
            // that leave it out keep it, so it can only be lost by a merge that raced.
            let pending = stored.remove("pendingCycleRunId");
            let resolved = || outcomes.iter().flatten().filter(|(_, r)| r.is_ok()).map(|(m, _)| m);
            let set: Vec<&Value> = resolved().filter_map(|m| m.get("pendingCycleRunId")).collect();
            assert_eq!(
                pending.is_some(),
                !set.is_empty(),
                "round {round}: pendingCycleRunId {pending:?}"
            );
            assert!(
                pending.as_ref().is_none_or(|p| set.contains(&p)),
                "round {round}: {pending:?}"
            );
            let stored = Value::Object(stored);
            let is_stored = |m: &Value| {
                let mut m = m.clone();
                m.as_object_mut().unwrap().remove("pendingCycleRunId");
                m == stored
            };
            let last_writes = outcomes.iter().filter_map(|w| w.iter().rev().find(|(_, r)| r.is_ok()));
            assert!(
                last_writes.map(|(m, _)| m).any(is_stored),
                "round {round}: the stored manifest is no thread's last resolved write"
            );
            if let Some(dir) = &dir {
                let tmps = fs::read_dir(dir)
                    .unwrap()
                    .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".tmp"))
                    .count();
                assert_eq!(tmps, 0, "temporary files left behind");
            }
        }
    }
}

#[test]
fn opening_removes_the_tmp_files_of_writers_that_are_gone_and_keeps_live_ones() {
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join("outer-loops");
    std::fs::create_dir_all(&dir).unwrap();
    let me = std::process::id();
    let file = |name: &str| {
        let path = dir.join(name);
        std::fs::write(&path, b"{").unwrap();
        path
    };
    // Named by an earlier version (<stem>.<pid>.<n>-<nanos>.tmp): judged by the pid.
    let old_dead = file("ol_1.json.2147483646.0-1.tmp");
    let old_live = file(&format!("ol_1.json.{me}.0-2.tmp"));
    // Named by this one: judged by the lock its writer holds, whatever the pid says. A writer
    // in another pid namespace has a pid that means nothing here (judged by it, the file would
    // be removed and the write fail); a dead predecessor may have had this process's pid.
    let held_elsewhere = file("ol_1.json.2147483646.0-3-flock.tmp");
    let writer = std::fs::File::open(&held_elsewhere).unwrap();
    assert_eq!(crate::process::lock_for_life(&writer), Some(true));
    let predecessor = file(&format!("ol_1.json.{me}.0-4-flock.tmp"));
    // Where an earlier version looks for the pid in a name, it finds this one's: it judges
    // these files by pid as it judges its own, and leaves live ones alone.
    let name = crate::durable::TmpFile::write_synced(&dir, "ol_9.json", b"{}").unwrap();
    let name = name.path.file_name().unwrap().to_str().unwrap().to_string();
    let stem = name.strip_suffix(".tmp").unwrap();
    assert_eq!(stem.rsplit('.').nth(1), Some(me.to_string().as_str()), "{name}");
    std::fs::remove_file(dir.join(&name)).unwrap();
    OuterLoops::new(local::LocalManifests::open(data.path()).unwrap());
    assert!(!old_dead.exists(), "a crashed writer's tmp file is removed");
    assert!(old_live.exists(), "a live writer's is not");
    assert!(held_elsewhere.exists(), "a locked one is not, whatever its pid");
    assert!(!predecessor.exists(), "an unlocked one is, whatever its pid");
    // A manifest written now takes no leftover's lock and leaves no file behind.
    let loops = OuterLoops::new(local::LocalManifests::open(data.path()).unwrap());
    loops.write(r#"{"outerLoopId":"ol_1","inputHash":"h"}"#).unwrap();
    let mut left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    let mut want = [
        "ol_1.json".to_string(),
        "ol_1.json.2147483646.0-3-flock.tmp".to_string(),
        format!("ol_1.json.{me}.0-2.tmp"),
    ];
    want.sort();
    assert_eq!(left, want);
}

#[test]
fn a_manifest_an_earlier_version_stored_with_an_empty_input_hash_stays_readable_and_writable() {
    let data = tempfile::tempdir().unwrap();
    let loops = OuterLoops::new(local::LocalManifests::open(data.path()).unwrap());
    let path = data.path().join("outer-loops/ol_e.json");
    fs::write(&path, r#"{"inputHash":"","outerLoopId":"ol_e"}"#).unwrap();
    assert!(loops.read("ol_e").unwrap().is_some());
    loops
        .write(r#"{"outerLoopId":"ol_e","inputHash":"","maxCycles":2}"#)
        .unwrap();
    assert_eq!(
        loops
            .write(r#"{"outerLoopId":"ol_e","inputHash":"h"}"#)
            .unwrap_err()
            .code(),
        "OUTER_LOOP_INPUT_MISMATCH"
    );
}

#[test]
fn a_stored_manifest_that_is_not_the_requested_loops_is_corrupt() {
    let root = tempfile::tempdir().unwrap();
    let loops = OuterLoops::new(local::LocalManifests::open(root.path()).unwrap());
    let path = root.path().join("outer-loops").join("ol_1.json");
    for (text, why) in [
        ("[]", "not a JSON object"),
        ("\"ol_1\"", "not a JSON object"),
        (r#"{"inputHash":"h"}"#, "outerLoopId"),
        (r#"{"outerLoopId":"ol_2","inputHash":"h"}"#, "outerLoopId"),
        (r#"{"outerLoopId":1,"inputHash":"h"}"#, "outerLoopId"),
        (r#"{"outerLoopId":"ol_1"}"#, "inputHash"),
        (r#"{"outerLoopId":"ol_1","inputHash":7}"#, "inputHash"),
        (r#"{"outerLoopId":"ol_1","#, "not JSON"),
        (
            "{\"outerLoopId\":\"ol_1\",\"inputHash\":\"h\",\"x\":\"\u{FFFD}\"}",
            "not UTF-8",
        ),
    ] {
        // The last case's replacement character stands for a byte that is not UTF-8.
        let bytes = text.replace('\u{FFFD}', "\u{1}").into_bytes();
        let bytes: Vec<u8> = bytes.into_iter().map(|b| if b == 1 { 0xff } else { b }).collect();
        fs::write(&path, &bytes).unwrap();
        let err = loops.read("ol_1").unwrap_err();
        assert_eq!(err.code(), "RUNTIME_INTEGRITY", "{text}: {err}");
        let msg = err.to_string();
        assert!(msg.contains("ol_1.json") && msg.contains(why), "{text}: {msg}");
        // A write does not paper over it either.
        let err = loops.write(r#"{"outerLoopId":"ol_1","inputHash":"h"}"#).unwrap_err();
        assert_eq!(err.code(), "RUNTIME_INTEGRITY", "{text}: {err}");
        assert_eq!(fs::read(&path).unwrap(), bytes);
    }
    fs::write(&path, r#"{"outerLoopId":"ol_1","inputHash":"h","extra":[1]}"#).unwrap();
    assert_eq!(
        loops.read("ol_1").unwrap().unwrap(),
        r#"{"extra":[1],"inputHash":"h","outerLoopId":"ol_1"}"#
    );
}

#[test]
fn writes_are_validated_against_the_manifest_shape() {
    let ok = r#"{"outerLoopId":"ol_v","inputHash":"sha256:a","maxCycles":0,"goal":{"description":"d","x":1},
        "cycles":[{"cycleNumber":1,"runId":"run_1","status":"completed","workflowVersionId":"wv_1","output":{},"x":1}],
        "pendingCycleRunId":null,"result":{"kind":"done","finalOutput":null,"x":1},"extra":true}"#;
    let base: Map<String, Value> = serde_json::from_str(ok).unwrap();
    let cycle = serde_json::json!({"cycleNumber": 1, "runId": "run_1", "status": "completed"});
    let bad: Vec<(&str, Value, &str)> = vec![
        ("outerLoopId", Value::from(5), "manifest.outerLoopId"),
        ("inputHash", Value::Null, "manifest.inputHash"),
        ("maxCycles", Value::from(-1), "manifest.maxCycles"),
        ("maxCycles", Value::from(1.5), "manifest.maxCycles"),
        ("maxCycles", Value::from(9_007_199_254_740_992u64), "manifest.maxCycles"),
        ("maxCycles", Value::from("5"), "manifest.maxCycles"),
        ("maxCycles", Value::Null, "manifest.maxCycles"),
        ("goal", Value::from("find a date"), "manifest.goal"),
        (
            "goal",
            serde_json::json!({"description": 1}),
            "manifest.goal.description",
        ),
        ("cycles", Value::from("no"), "manifest.cycles"),
        ("cycles", serde_json::json!([cycle, 7]), "manifest.cycles[1]"),
        (
            "cycles",
            serde_json::json!([cycle, cycle, {"cycleNumber": 3, "status": "completed"}]),
            "manifest.cycles[2].runId",
        ),
        (
            "cycles",
            serde_json::json!([{"cycleNumber": 0, "runId": "run_1", "status": "s"}]),
            "manifest.cycles[0].cycleNumber",
        ),
        (
            "cycles",
            serde_json::json!([{"cycleNumber": 1.5, "runId": "run_1", "status": "s"}]),
            "manifest.cycles[0].cycleNumber",
        ),
        (
            "cycles",
            serde_json::json!([{"cycleNumber": "1", "runId": "run_1", "status": "s"}]),
            "manifest.cycles[0].cycleNumber",
        ),
        (
            "cycles",
            serde_json::json!([{"runId": "run_1", "status": "s"}]),
            "manifest.cycles[0].cycleNumber",
        ),
        (
            "cycles",
            serde_json::json!([{"cycleNumber": 1, "runId": 1, "status": "s"}]),
            "manifest.cycles[0].runId",
        ),
        (
            "cycles",
            serde_json::json!([{"cycleNumber": 1, "runId": "run_1"}]),
            "manifest.cycles[0].status",
        ),
        (
            "cycles",
            serde_json::json!([{"cycleNumber": 1, "runId": "run_1", "status": "s", "workflowVersionId": 2}]),
            "manifest.cycles[0].workflowVersionId",
        ),
        ("pendingCycleRunId", Value::from(5), "manifest.pendingCycleRunId"),
        ("result", serde_json::json!({"kind": "maybe"}), "manifest.result.kind"),
        ("result", serde_json::json!({"finalOutput": 1}), "manifest.result.kind"),
        ("result", Value::from("done"), "manifest.result"),
        ("result", Value::Null, "manifest.result"),
    ];
    let root = tempfile::tempdir().unwrap();
    for loops in [
        OuterLoops::new(local::LocalManifests::open(root.path()).unwrap()),
        OuterLoops::new(r#virtual::VirtualManifests::new()),
    ] {
        for (field, value, want) in &bad {
            let mut m = base.clone();
            m.insert(field.to_string(), value.clone());
            let err = loops.write(&Value::Object(m).to_string()).unwrap_err();
            match &err {
                WorldError::Validation { path, .. } => assert_eq!(path, want, "{field}: {value}"),
                other => panic!("{field}: {value}: {other}"),
            }
            assert_eq!(loops.read("ol_v").unwrap(), None, "{field}: {value} was stored");
        }
        // Every optional field may be left out, and extra fields are kept.
        loops.write(r#"{"outerLoopId":"ol_v","inputHash":"sha256:a"}"#).unwrap();
        loops.write(ok).unwrap();
        let stored: Value = serde_json::from_str(&loops.read("ol_v").unwrap().unwrap()).unwrap();
        assert_eq!(stored["extra"], true);
        assert_eq!(stored["cycles"][0]["x"], 1);
    }
}
