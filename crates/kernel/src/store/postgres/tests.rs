//! The writer's memory of its streams: a group on streams it has committed to commits in one
//! round trip, and whatever another writer committed meanwhile is found at that commit and
//! answered as the locks would answer it. Also the reader's listing stopped part way.

use super::PgWriter;
use crate::error::Result;
use crate::events::{commit_batch, prepare, AppendRequest, Artifacts};
use crate::pg::testing::{test_schema, TestSchema};
use crate::store::LogReader;
use crate::vocabulary::Stream;
use serde_json::{json, Value};

struct NoArtifacts;
impl Artifacts for NoArtifacts {
    fn artifact_exists(&self, _id: &str) -> Result<bool> {
        Ok(false)
    }
    fn json_id(&self, _run: &str, _step: &str, _name: &str, _json: &str) -> String {
        unreachable!("no payload here is large enough to move out")
    }
    fn store_json(&self, _run: &str, _step: &str, _name: &str, _json: String) -> Result<String> {
        unreachable!("no payload here is large enough to move out")
    }
}

/// One append: a fact `StepStarted` (`payload`), or a run-event draft (`draft`, type inside).
struct Append {
    run: &'static str,
    payload: Value,
    draft: bool,
    key: Option<&'static str>,
    expected: Option<u64>,
}

fn fact(run: &'static str, step: &str) -> Append {
    Append {
        run,
        payload: json!({ "stepPath": step }),
        draft: false,
        key: None,
        expected: None,
    }
}

fn draft(run: &'static str, draft: Value) -> Append {
    Append {
        run,
        payload: draft,
        draft: true,
        key: None,
        expected: None,
    }
}

/// Commit `appends` as one group through `w`: each one's envelope, or its error's code.
fn commit(w: &mut PgWriter, appends: Vec<Append>) -> Vec<std::result::Result<Value, String>> {
    let mut batch = Vec::new();
    for a in appends {
        let req = AppendRequest {
            run_id: a.run.into(),
            event_type: if a.draft { String::new() } else { "StepStarted".into() },
            payload_json: a.payload.to_string(),
            key: a.key.map(str::to_string),
            draft: a.draft.then_some(Stream::Run),
            expected_sequence: a.expected,
            index: Vec::new(),
            strings: Vec::new(),
        };
        batch.push(prepare(req, &NoArtifacts).unwrap());
    }
    commit_batch(w, &NoArtifacts, &mut batch, "2026-12-04T00:00:00.000Z")
        .into_iter()
        .map(|o| {
            o.map(|e| serde_json::from_str(&e).unwrap())
                .map_err(|e| e.code().to_string())
        })
        .collect()
}

fn sequence(outcome: &std::result::Result<Value, String>) -> u64 {
    outcome.as_ref().unwrap()["sequence"].as_u64().unwrap()
}

/// Two writers on one fresh schema, and a reader.
fn two_writers(schema: &TestSchema) -> (PgWriter, PgWriter, super::PgReader) {
    let db = schema.db();
    (
        PgWriter::new(db.clone()).unwrap(),
        PgWriter::new(schema.db()).unwrap(),
        super::PgReader::new(db),
    )
}

fn stored_sequences(r: &super::PgReader, run: &str) -> Vec<u64> {
    let mut seqs = Vec::new();
    r.rows(run, 0, None, &mut |row| {
        seqs.push(row.sequence);
        Ok(())
    })
    .unwrap();
    seqs
}

#[test]
fn a_stream_the_writer_committed_to_is_appended_to_from_memory() {
    let Some(schema) = test_schema() else { return };
    let (mut a, _b, r) = two_writers(&schema);
    assert_eq!(sequence(&commit(&mut a, vec![fact("run_m", "s1")])[0]), 1);
    assert_eq!(
        a.remembered_commits, 0,
        "the first append reads the stream under its lock"
    );
    for i in 2..=5 {
        let out = commit(&mut a, vec![fact("run_m", "s"), fact("run_m", "t")]);
        assert_eq!(sequence(&out[1]), 2 * i - 1);
    }
    assert_eq!(a.remembered_commits, 4);
    assert_eq!(stored_sequences(&r, "run_m"), (1..=9).collect::<Vec<_>>());
    // A stream new to the group goes under the locks again, with the rest of the group.
    let out = commit(&mut a, vec![fact("run_m", "s"), fact("run_n", "s")]);
    assert_eq!((sequence(&out[0]), sequence(&out[1])), (10, 1));
    assert_eq!(a.remembered_commits, 4);
}

#[test]
fn an_append_from_memory_after_another_writer_appended_goes_after_it() {
    let Some(schema) = test_schema() else { return };
    let (mut a, mut b, r) = two_writers(&schema);
    commit(&mut a, vec![fact("run_s", "a1")]);
    commit(&mut b, vec![fact("run_s", "b1")]);
    // `a` remembers sequence 1 as the last: the row it would add is there.
    let out = commit(&mut a, vec![fact("run_s", "a2"), fact("run_s", "a3")]);
    assert_eq!((sequence(&out[0]), sequence(&out[1])), (3, 4));
    assert_eq!(a.remembered_commits, 0);
    // `b` remembers 2, and expects what is really the last: the refusal it would make from memory
    // is not the answer.
    let out = commit(
        &mut b,
        vec![Append {
            expected: Some(4),
            ..fact("run_s", "b2")
        }],
    );
    assert_eq!(sequence(&out[0]), 5);
    // And a refusal that holds is made under the locks too, with the stored last sequence.
    let out = commit(
        &mut a,
        vec![Append {
            expected: Some(4),
            ..fact("run_s", "a4")
        }],
    );
    assert_eq!(out[0].as_ref().unwrap_err(), "EVENT_SEQUENCE_CONFLICT");
    assert_eq!(stored_sequences(&r, "run_s"), (1..=5).collect::<Vec<_>>());
}

#[test]
fn a_key_another_writer_took_is_answered_with_its_event() {
    let Some(schema) = test_schema() else { return };
    let (mut a, mut b, r) = two_writers(&schema);
    commit(&mut a, vec![fact("run_k", "a1")]);
    commit(&mut b, vec![fact("run_k", "b1")]);
    let keyed = |step: &str| Append {
        key: Some("k"),
        ..fact("run_k", if step.is_empty() { "x" } else { step })
    };
    let first = commit(&mut a, vec![keyed("x")]);
    assert_eq!(sequence(&first[0]), 3);
    // `b` brings its memory up to date with an append of its own, so that only the key is new
    // to it: the key's unique index refuses the row, and the retry gets the stored event.
    commit(&mut b, vec![fact("run_k", "b2")]);
    let before = b.remembered_commits;
    let retry = commit(&mut b, vec![keyed("x")]);
    assert_eq!(retry[0].as_ref().unwrap(), first[0].as_ref().unwrap());
    let other = commit(&mut b, vec![keyed("y")]);
    assert_eq!(other[0].as_ref().unwrap_err(), "EVENT_APPEND_IDEMPOTENCY_CONFLICT");
    assert_eq!(b.remembered_commits, before, "neither committed from memory");
    assert_eq!(stored_sequences(&r, "run_k"), (1..=4).collect::<Vec<_>>());
    // Later appends of `b` are from memory again.
    assert_eq!(sequence(&commit(&mut b, vec![fact("run_k", "b3")])[0]), 5);
    assert_eq!(b.remembered_commits, before + 1);
}

#[test]
fn an_end_another_writer_appended_is_found_from_memory() {
    let Some(schema) = test_schema() else { return };
    let (mut a, mut b, r) = two_writers(&schema);
    let started = json!({"type": "sample.step", "stepPath": "n1"});
    let completed = json!({"type": "sample.node_ended", "nodeId": "n1"});
    commit(&mut a, vec![draft("run_e", started.clone())]);
    commit(&mut b, vec![draft("run_e", started)]);
    // Both remember the stream; `a` ends node n1, then `b`, remembering no end of it, tries.
    commit(&mut a, vec![draft("run_e", completed.clone())]);
    commit(&mut b, vec![fact("run_e", "b")]);
    let again = commit(&mut b, vec![draft("run_e", completed)]);
    assert_eq!(again[0].as_ref().unwrap_err(), "EVENT_VALIDATION");
    // `a` ends the run; `b`, remembering it open, appends.
    let run_completed = json!({"type": "sample.completed"});
    assert!(commit(&mut a, vec![draft("run_e", run_completed)])[0].is_ok());
    let after = commit(&mut b, vec![fact("run_e", "late")]);
    assert_eq!(after[0].as_ref().unwrap_err(), "EVENT_VALIDATION");
    assert_eq!(stored_sequences(&r, "run_e"), (1..=5).collect::<Vec<_>>());
}

#[test]
fn a_writer_forgets_its_streams_with_its_connection() {
    // At `synchronous_commit` off a server that restarts may lose commits it acknowledged: the
    // writer's new connection must not trust a last sequence remembered from before.
    let Some(schema) = test_schema() else { return };
    let (mut a, _b, r) = two_writers(&schema);
    for step in ["s1", "s2", "s3"] {
        commit(&mut a, vec![fact("run_l", step)]);
    }
    let db = schema.db();
    db.block_on(async {
        let c = db.connect().await.unwrap();
        let s = &db.schema;
        c.batch_execute(&format!(
            "DELETE FROM {s}.events WHERE run_id = 'run_l' AND sequence > 1;
             UPDATE {s}.runs SET last_sequence = 1 WHERE run_id = 'run_l';"
        ))
        .await
        .unwrap();
        c.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()",
            &[&format!("little_workflow {}", schema.name)],
        )
        .await
        .unwrap();
    });
    std::thread::sleep(std::time::Duration::from_millis(100));
    let out = commit(&mut a, vec![fact("run_l", "after")]);
    // The first try may meet the connection's end; what matters is that no row leaves a hole.
    let out = if out[0].is_err() {
        commit(&mut a, vec![fact("run_l", "after")])
    } else {
        out
    };
    assert_eq!(sequence(&out[0]), 2);
    assert_eq!(stored_sequences(&r, "run_l"), [1, 2]);
}

#[test]
fn writers_appending_to_the_same_streams_in_any_order_never_wait_for_each_other_forever() {
    let Some(schema) = test_schema() else { return };
    const RUNS: [&str; 6] = ["run_o1", "run_o2", "run_o3", "run_o4", "run_o5", "run_o6"];
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let mut writer = PgWriter::new(schema.db()).unwrap();
            std::thread::spawn(move || {
                for g in 0..60 {
                    // Each group names the streams in another order; a deadlock between the two
                    // writers would fail a group (the server breaks it after a second).
                    let mut runs = RUNS.to_vec();
                    runs.rotate_left((g * 5 + w * 3) % RUNS.len());
                    if g % 2 == w {
                        runs.reverse();
                    }
                    let out = commit(&mut writer, runs.iter().map(|r| fact(r, "s")).collect());
                    assert!(out.iter().all(|o| o.is_ok()), "{out:?}");
                }
                writer.remembered_commits
            })
        })
        .collect();
    let remembered: u64 = writers.into_iter().map(|t| t.join().unwrap()).sum();
    let r = super::PgReader::new(schema.db());
    for run in RUNS {
        assert_eq!(stored_sequences(&r, run), (1..=120).collect::<Vec<_>>());
    }
    assert!(remembered > 0);
}

#[test]
fn a_schema_of_the_version_before_is_migrated_on_first_use() {
    let Some(schema) = test_schema() else { return };
    let (mut a, _b, _r) = two_writers(&schema);
    commit(&mut a, vec![fact("run_v", "s1")]);
    // What the version before fold snapshots left: no fold snapshots, and no runs catalog.
    let db = schema.db();
    let s = db.schema.clone();
    let version = |db: &crate::pg::Db| {
        db.block_on(async {
            let c = db.connect().await.unwrap();
            let row = c
                .query_one(
                    &format!("SELECT version, to_regclass('{s}.fold_snapshots') IS NOT NULL FROM {s}.world_schema"),
                    &[],
                )
                .await
                .unwrap();
            (row.get::<_, i32>(0), row.get::<_, bool>(1))
        })
    };
    assert_eq!(version(&db), (crate::pg::schema::SCHEMA_VERSION, true));
    db.block_on(async {
        let c = db.connect().await.unwrap();
        c.batch_execute(&format!(
            "DROP TABLE {s}.fold_snapshots; DROP TABLE {s}.artifact_objects;
             DROP INDEX {s}.runs_by_time; DROP INDEX {s}.runs_by_status;
             ALTER TABLE {s}.runs DROP CONSTRAINT runs_last_sequence_known, DROP COLUMN status, DROP COLUMN written_after;
             UPDATE {s}.world_schema SET version = 2"
        ))
        .await
        .unwrap();
    });
    // A world of this version opening it brings it up to date, and keeps what it held.
    let mut fresh = PgWriter::new(schema.db()).unwrap();
    assert_eq!(sequence(&commit(&mut fresh, vec![fact("run_v", "s2")])[0]), 2);
    assert_eq!(version(&db), (crate::pg::schema::SCHEMA_VERSION, true));
}

#[test]
fn a_listing_stopped_part_way_leaves_its_connection_fit_for_the_next() {
    // The rows are read by a task on the runtime and handed over in batches; a taker that stops
    // (a damaged row, say) stops that task with rows still coming, on the pool's one connection.
    let Some(schema) = test_schema() else { return };
    let db = crate::pg::Db::new(crate::pg::Options {
        max_connections: 3,
        ..schema.options()
    })
    .unwrap();
    let mut w = PgWriter::new(db.clone()).unwrap();
    // More rows than the batches the reading task may hold before the taker takes them.
    for _ in 0..24 {
        let out = commit(&mut w, (0..500).map(|_| fact("run_big", "s")).collect());
        assert!(out.iter().all(|o| o.is_ok()));
    }
    let r = super::PgReader::new(db);
    for stop_at in [5, 6000, 11_999] {
        let mut seen = 0;
        let err = r
            .rows("run_big", 0, None, &mut |row| {
                seen += 1;
                if row.sequence == stop_at {
                    return Err(crate::error::WorldError::validation("row", "stopped here"));
                }
                Ok(())
            })
            .unwrap_err();
        assert_eq!((err.code(), seen), ("EVENT_VALIDATION", stop_at));
        assert_eq!(stored_sequences(&r, "run_big"), (1..=12_000).collect::<Vec<_>>());
    }
}
