//! `NativeWorld`: one open world, as `world.ts` sees it.

use crate::completion::JsCompleter;
use crate::{guarded, throw, RawValue};
use little_world_kernel::artifacts::{Data, Encoding, NewArtifact};
use little_world_kernel::error::WorldError;
use little_world_kernel::events::{self, AppendRequest};
use little_world_kernel::runtime::Ticket;
use little_world_kernel::store::Durability;
use little_world_kernel::world::World;
use little_world_vocabularies::materialize::{pricing::Pricing, Priced};
use little_world_vocabularies::run_events::{self, Stream};
use napi::bindgen_prelude::Buffer;
use napi::Env;
use napi_derive::napi;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// How long the JavaScript thread may wait in place for a lone append (see `submit_with`).
const WAIT_IN_PLACE: Duration = Duration::from_micros(250);

/// An export under way: `NativeWorld.exportNext` writes its next piece.
#[napi]
pub struct NativeExport {
    export: little_world_kernel::world::Export,
}

/// An import under way: `NativeWorld.importPush` reads its next bytes.
#[napi]
pub struct NativeImport {
    import: little_world_kernel::world::Import,
}

/// Where a world keeps its artifacts' bytes instead of its own store (`artifacts.s3`).
#[napi(object)]
pub struct S3Options {
    pub bucket: String,
    pub prefix: Option<String>,
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub force_path_style: Option<bool>,
}

impl S3Options {
    fn into_core(self) -> little_world_kernel::artifacts::bucket::BucketOptions {
        little_world_kernel::artifacts::bucket::BucketOptions {
            bucket: self.bucket,
            prefix: self
                .prefix
                .unwrap_or_else(|| little_world_kernel::artifacts::bucket::DEFAULT_PREFIX.to_string()),
            endpoint: self.endpoint,
            region: self.region,
            force_path_style: self.force_path_style.unwrap_or(false),
        }
    }
}

/// One append of a group (see `NativeWorld.appendGroup`), with the fields of
/// `NativeWorld.append`.
#[napi(object)]
pub struct GroupAppend {
    pub event_type: String,
    pub payload_json: String,
    pub strings: Option<Vec<String>>,
    pub idempotency_key: Option<String>,
    pub expected_sequence: Option<i64>,
    pub index_json: Option<String>,
}

/// An open world. Every asynchronous method returns a promise that one of the world's own
/// threads settles; none of them runs on the libuv pool.
#[napi]
pub struct NativeWorld {
    world: World,
    completer: Arc<JsCompleter>,
}

fn durability(name: &str) -> Result<Durability, WorldError> {
    match name {
        "full" => Ok(Durability::Full),
        "normal" => Ok(Durability::Normal),
        other => Err(WorldError::validation(
            "durability",
            format!(
                "must be 'full' or 'normal', not {}",
                little_world_kernel::canonical::string_literal(other)
            ),
        )),
    }
}

/// Convert an optional JavaScript number to a count, or say what is wrong with it.
fn count_arg(name: &str, v: Option<f64>) -> Result<Option<u64>, WorldError> {
    match v {
        None => Ok(None),
        Some(f) if f >= 0.0 && f.fract() == 0.0 && f <= little_world_kernel::numbers::MAX_SAFE_INTEGER => {
            Ok(Some(f as u64))
        }
        Some(_) => Err(WorldError::validation(name, "must be a non-negative safe integer")),
    }
}

/// The priced materializer with the bundled prices and `pricing_json` merged over them.
fn priced(pricing_json: Option<&str>) -> Result<Arc<Priced>, WorldError> {
    Ok(Arc::new(Priced(Pricing::with_override(pricing_json)?)))
}

#[napi]
impl NativeWorld {
    /// Open (creating if needed) the local world at `dataDir`; with `readOnly`, open the existing
    /// world there for reading only.
    #[napi(factory)]
    pub fn open_local(
        env: Env,
        data_dir: String,
        durability_name: String,
        pricing_json: Option<String>,
        read_only: Option<bool>,
        s3: Option<S3Options>,
    ) -> napi::Result<Self> {
        let completer = Arc::new(JsCompleter::new(env.raw())?);
        let opened = guarded(|| durability(&durability_name)).and_then(|d| {
            let pricing = priced(pricing_json.as_deref())?;
            let dir = Path::new(&data_dir);
            guarded(|| {
                let bucket = s3.map(S3Options::into_core);
                if read_only == Some(true) {
                    World::open_local_read_only_with(dir, bucket, pricing, completer.clone())
                } else {
                    World::open_local_with(dir, d, bucket, pricing, completer.clone())
                }
            })
        });
        match opened {
            Ok(world) => Ok(NativeWorld { world, completer }),
            Err(e) => Err(throw(&env, &e)),
        }
    }

    /// Open a fresh in-memory world.
    #[napi(factory)]
    pub fn open_virtual(env: Env, pricing_json: Option<String>) -> napi::Result<Self> {
        let pricing = priced(pricing_json.as_deref()).map_err(|e| throw(&env, &e))?;
        let completer = Arc::new(JsCompleter::new(env.raw())?);
        let world = guarded(|| World::open_virtual(pricing, completer.clone())).map_err(|e| throw(&env, &e))?;
        Ok(NativeWorld { world, completer })
    }

    /// Open the world in a PostgreSQL database and schema; nothing is connected until a call
    /// needs the server.
    #[napi(factory)]
    #[allow(clippy::too_many_arguments)]
    pub fn open_postgres(
        env: Env,
        connection_string: String,
        schema: Option<String>,
        durability_name: String,
        pricing_json: Option<String>,
        lock_lease_ms: Option<f64>,
        max_connections: Option<f64>,
        read_only: Option<bool>,
        s3: Option<S3Options>,
    ) -> napi::Result<Self> {
        let completer = Arc::new(JsCompleter::new(env.raw())?);
        let opened = guarded(|| {
            let relaxed = durability(&durability_name)? == Durability::Normal;
            let lease = count_arg("lockLeaseMs", lock_lease_ms)?.unwrap_or(30_000);
            if lease == 0 {
                return Err(WorldError::validation("lockLeaseMs", "must be at least 1"));
            }
            let max_connections = count_arg("maxConnections", max_connections)?.unwrap_or(8);
            let pricing = priced(pricing_json.as_deref())?;
            let options = little_world_kernel::pg::Options {
                connection_string,
                schema: schema.unwrap_or_else(|| little_world_kernel::pg::DEFAULT_SCHEMA.to_string()),
                relaxed,
                lease: Duration::from_millis(lease),
                max_connections: max_connections.min(10_000) as usize,
                read_only: read_only == Some(true),
            };
            World::open_postgres_with(options, s3.map(S3Options::into_core), pricing, completer.clone())
        });
        match opened {
            Ok(world) => Ok(NativeWorld { world, completer }),
            Err(e) => Err(throw(&env, &e)),
        }
    }

    /// `"local"`, `"virtual"`, or the kind of another backend.
    #[napi(getter)]
    pub fn kind(&self) -> &'static str {
        self.world.kind()
    }

    /// The resolved data directory of a local world.
    #[napi(getter)]
    pub fn data_dir(&self) -> Option<String> {
        self.world.data_dir().map(|p| p.display().to_string())
    }

    /// Whether `close()` has been called.
    #[napi(getter)]
    pub fn closed(&self) -> bool {
        self.world.is_closed()
    }

    fn submit(&self, env: &Env, f: impl FnOnce(Ticket) -> Result<(), WorldError>) -> napi::Result<RawValue> {
        self.submit_with(env, Duration::ZERO, |t, _| f(t))
    }

    /// Start an operation; if it is the only one in flight and `wait` is not zero, wait for it
    /// here for up to `wait`, so that a caller awaiting one append at a time does not also pay
    /// for waking the JavaScript thread (a commit without fsync takes tens of microseconds). The
    /// wait is bounded, so the event loop is never held longer than that. `f` is told whether
    /// the operation is waited for here.
    fn submit_with(
        &self,
        env: &Env,
        wait: Duration,
        f: impl FnOnce(Ticket, bool) -> Result<(), WorldError>,
    ) -> napi::Result<RawValue> {
        let (ticket, promise) = self.completer.begin(env.raw())?;
        let waiting = !wait.is_zero() && self.completer.alone();
        if waiting {
            self.completer.arm(ticket);
        }
        match guarded(|| f(ticket, waiting)) {
            Err(e) => {
                if waiting {
                    self.completer.wait_briefly(env.raw(), ticket, Duration::ZERO);
                }
                self.completer.settle_now(env.raw(), ticket, Err(e));
            }
            Ok(()) if waiting => {
                // Past the burst the result could not be settled here anyway: only take it if
                // it is there already (an append committed in the call).
                let budget = if self.completer.has_room() {
                    wait
                } else {
                    Duration::ZERO
                };
                self.completer.wait_briefly(env.raw(), ticket, budget);
            }
            Ok(()) => {}
        }
        Ok(RawValue(promise))
    }

    /// Append an event; resolves with the envelope's canonical JSON after its commit. `strings`
    /// are long strings of the payload sent beside its JSON text, which holds `"\u0000<index>"`
    /// in their places (see `AppendRequest::strings`). `expected_sequence` and `index_json` (a
    /// JSON array of `{ index, key, value }`) are `AppendRequest::expected_sequence` and `index`.
    /// The fields are passed flat: an options object per append would cost on the hot path.
    #[allow(clippy::too_many_arguments)]
    #[napi(ts_return_type = "Promise<string>")]
    pub fn append(
        &self,
        env: Env,
        run_id: String,
        event_type: String,
        payload_json: String,
        idempotency_key: Option<String>,
        #[napi(ts_arg_type = "Array<string> | undefined | null")] strings: Option<Vec<String>>,
        expected_sequence: Option<i64>,
        index_json: Option<String>,
    ) -> napi::Result<RawValue> {
        // A commit across a network takes longer than the wait: waiting would only hold a core.
        let wait = if self.world.commits_quickly() {
            WAIT_IN_PLACE
        } else {
            Duration::ZERO
        };
        self.submit_with(&env, wait, |t, waiting| {
            let index = match &index_json {
                Some(text) => events::index_writes_from_json(text).map_err(|e| e.for_run(&run_id))?,
                None => Vec::new(),
            };
            let req = AppendRequest {
                run_id,
                event_type,
                payload_json,
                strings: strings.unwrap_or_default(),
                key: idempotency_key,
                draft: None,
                expected_sequence: expected_sequence.map(|s| s.max(0) as u64),
                index,
            };
            if waiting {
                self.world.append_awaited(t, req)
            } else {
                self.world.append(t, req)
            }
        })
    }

    /// Move up to `limit` artifacts stored before the world had a bucket into it; resolves with
    /// `{ moved, bytes, left }` as JSON.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn move_artifacts(&self, env: Env, limit: u32) -> napi::Result<RawValue> {
        self.submit(&env, |t| self.world.move_artifacts(t, limit))
    }

    /// Append events to a run in one transaction, whole or not at all; resolves with their
    /// envelopes' canonical JSON, in order.
    #[napi(ts_return_type = "Promise<string[]>")]
    pub fn append_group(&self, env: Env, run_id: String, group: Vec<GroupAppend>) -> napi::Result<RawValue> {
        self.submit(&env, |t| {
            let reqs = group
                .into_iter()
                .map(|g| {
                    let index = match &g.index_json {
                        Some(text) => events::index_writes_from_json(text).map_err(|e| e.for_run(&run_id))?,
                        None => Vec::new(),
                    };
                    Ok(AppendRequest {
                        run_id: run_id.clone(),
                        event_type: g.event_type,
                        payload_json: g.payload_json,
                        strings: g.strings.unwrap_or_default(),
                        key: g.idempotency_key,
                        draft: None,
                        expected_sequence: g.expected_sequence.map(|s| s.max(0) as u64),
                        index,
                    })
                })
                .collect::<Result<Vec<_>, WorldError>>()?;
            self.world.append_group(t, reqs)
        })
    }

    /// Append a run-event draft (JSON text, `type` included) to a run (`session: false`) or a
    /// session; resolves with the envelope's canonical JSON.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn append_draft(
        &self,
        env: Env,
        stream_id: String,
        draft_json: String,
        session: bool,
    ) -> napi::Result<RawValue> {
        self.submit(&env, |t| {
            self.world.append(
                t,
                AppendRequest {
                    run_id: stream_id,
                    event_type: String::new(),
                    payload_json: draft_json,
                    strings: Vec::new(),
                    key: None,
                    draft: Some(if session { Stream::Session } else { Stream::Run }),
                    expected_sequence: None,
                    index: Vec::new(),
                },
            )
        })
    }

    /// Entry `key` of `index`: resolves with its JSON, or `null`.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn index_entry(&self, env: Env, index: String, key: String) -> napi::Result<RawValue> {
        self.submit(&env, |t| self.world.index_entry(t, index, key))
    }

    /// Entries of `index` (with `value`, if given) after key `after`, at most `limit`, by key;
    /// resolves with a JSON array.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn index_entries(
        &self,
        env: Env,
        index: String,
        value: Option<String>,
        after: Option<String>,
        limit: u32,
        descending: bool,
    ) -> napi::Result<RawValue> {
        self.submit(&env, |t| {
            self.world
                .index_entries(t, index, value, after, u64::from(limit), descending)
        })
    }

    /// A stream's events as run (or session) events, JSON array text. `strict` is the replay read.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn run_events(&self, env: Env, stream_id: String, strict: bool) -> napi::Result<RawValue> {
        self.submit(&env, |t| {
            self.world
                .read_stream(t, stream_id, move |r, id| run_events::stored::read_log(r, id, strict))
        })
    }

    /// Fold a run's stored events into its state, inside Rust; resolves with its canonical JSON.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn materialize(&self, env: Env, run_id: String) -> napi::Result<RawValue> {
        self.submit(&env, |t| self.world.materialize(t, run_id))
    }

    /// Publish an artifact; resolves with its manifest's JSON. `text` carries a `json` payload (as
    /// JSON text) or a `utf8` one; `bytes` a `bytes` one, copied here, during the call: once it
    /// returns, JavaScript may detach or resize the buffer's memory (transfer it, shrink it) and
    /// the collector free it, so nothing may read it later.
    #[napi(ts_return_type = "Promise<string>")]
    #[allow(clippy::too_many_arguments)]
    pub fn write_artifact(
        &self,
        env: Env,
        run_id: String,
        step_path: String,
        name: String,
        content_type: String,
        encoding: String,
        #[napi(ts_arg_type = "string | undefined | null")] text: Option<String>,
        bytes: Option<Buffer>,
    ) -> napi::Result<RawValue> {
        self.submit(&env, |t| {
            let meta = NewArtifact {
                run_id,
                step_path,
                name,
                content_type,
                encoding: Encoding::parse(&encoding)?,
            };
            let data = match (text, bytes) {
                (Some(s), _) => Data::Text(s),
                (None, Some(b)) => Data::Bytes(b.to_vec()),
                (None, None) => return Err(WorldError::validation("input.payload", "is missing")),
            };
            self.world.write_artifact(t, meta, data)
        })
    }

    /// Read and verify an artifact; resolves with `[manifestJson, payload]`.
    #[napi(ts_return_type = "Promise<[string, string | Buffer]>")]
    pub fn read_artifact(&self, env: Env, reference: String) -> napi::Result<RawValue> {
        self.submit(&env, |t| self.world.read_artifact(t, &reference))
    }

    /// Take the lock of a run (`kind` `"run"`) or an outer loop (`"outer-loop"`) by its id,
    /// waiting up to `waitMs`; resolves with `{"name","token"}` JSON.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn acquire_lock(&self, env: Env, kind: String, id: String, wait_ms: f64) -> napi::Result<RawValue> {
        self.submit(&env, |t| {
            let wait = count_arg("waitMs", Some(wait_ms))?.unwrap_or(0);
            self.world.acquire_lock(t, &kind, &id, Duration::from_millis(wait))
        })
    }

    /// Let go of a lock; a token that does not own it is refused.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn release_lock(&self, env: Env, name: String, token: String) -> napi::Result<RawValue> {
        self.submit(&env, |t| self.world.release_lock(t, name, token))
    }

    /// An outer-loop manifest's JSON, or `null`.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn read_outer_loop(&self, env: Env, outer_loop_id: String) -> napi::Result<RawValue> {
        self.submit(&env, |t| self.world.read_outer_loop(t, outer_loop_id))
    }

    /// Write an outer-loop manifest (JSON text).
    #[napi(ts_return_type = "Promise<void>")]
    pub fn write_outer_loop(&self, env: Env, manifest_json: String) -> napi::Result<RawValue> {
        self.submit(&env, |t| self.world.write_outer_loop(t, manifest_json))
    }

    /// Re-check a run, or the whole world, with the store's own check `thorough` or fast;
    /// resolves with the report's JSON.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn verify(&self, env: Env, run_id: Option<String>, thorough: Option<bool>) -> napi::Result<RawValue> {
        self.submit(&env, |t| self.world.verify(t, run_id, thorough == Some(true)))
    }

    /// The runs in the world with count, times, status and cost, as JSON.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn runs(&self, env: Env) -> napi::Result<RawValue> {
        self.submit(&env, |t| self.world.runs(t))
    }

    /// Delete a run and what it owns (`token`: the run's lock, when the caller holds it):
    /// `{ runId, deleted, events, artifacts, bytes }` as JSON.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn delete_run(&self, env: Env, run_id: String, token: Option<String>) -> napi::Result<RawValue> {
        self.submit(&env, |t| self.world.delete_run(t, run_id, token))
    }

    /// Delete the runs that ended before a time, `request` the options as JSON: `{ runs, events,
    /// artifacts, bytes, runIds? }` as JSON.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn prune_runs(&self, env: Env, request: String) -> napi::Result<RawValue> {
        self.submit(&env, |t| self.world.prune_runs(t, &request))
    }

    /// Give the space deleted runs freed back to the operating system.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn compact(&self, env: Env) -> napi::Result<RawValue> {
        self.submit(&env, |t| self.world.compact(t))
    }

    /// Copy a local world into `dir` while it is written.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn backup(&self, env: Env, dir: String) -> napi::Result<RawValue> {
        self.submit(&env, |t| self.world.backup(t, dir))
    }

    /// A page of the runs catalog, `request` the options as JSON: `{ runs, cursor }` as JSON.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn query_runs(&self, env: Env, request: String) -> napi::Result<RawValue> {
        self.submit(&env, |t| self.world.query_runs(t, &request))
    }

    /// Start an export, `request` its options as JSON (`{ runIds?, status?, endedBefore? }`).
    #[napi]
    pub fn export_start(&self, env: Env, request: String) -> napi::Result<NativeExport> {
        let export = guarded(|| self.world.export_start(&request)).map_err(|e| throw(&env, &e))?;
        Ok(NativeExport { export })
    }

    /// The export's next piece of archive, or nothing once it is whole.
    #[napi(ts_return_type = "Promise<Buffer | undefined>")]
    pub fn export_next(&self, env: Env, cursor: &NativeExport) -> napi::Result<RawValue> {
        self.submit(&env, |t| self.world.export_next(t, &cursor.export))
    }

    /// Start an import into this world.
    #[napi]
    pub fn import_start(&self, env: Env) -> napi::Result<NativeImport> {
        let import = guarded(|| self.world.import_start()).map_err(|e| throw(&env, &e))?;
        Ok(NativeImport { import })
    }

    /// Read the archive's next bytes, committing the runs they complete.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn import_push(&self, env: Env, cursor: &NativeImport, bytes: Buffer) -> napi::Result<RawValue> {
        let bytes = bytes.to_vec();
        self.submit(&env, |t| self.world.import_push(t, &cursor.import, bytes))
    }

    /// The archive has no more bytes: `{ runs, events, artifacts, unchanged }` as JSON.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn import_finish(&self, env: Env, cursor: &NativeImport) -> napi::Result<RawValue> {
        self.submit(&env, |t| self.world.import_finish(t, &cursor.import))
    }

    /// Committed envelopes packed for `world.ts`: `[text, table, ...]`, a pair per part, where the
    /// table holds, per row, the sequence and where each piece of the row starts in its text
    /// (little-endian f64s). With `maxUnits`, whole rows up to the first that takes the text to that
    /// many UTF-16 code units (at least one row).
    #[napi(ts_return_type = "Promise<Array<string | Buffer>>")]
    pub fn list_packed(
        &self,
        env: Env,
        run_id: String,
        after_sequence: Option<f64>,
        limit: Option<f64>,
        max_units: Option<f64>,
    ) -> napi::Result<RawValue> {
        self.submit(&env, |t| {
            let after = count_arg("afterSequence", after_sequence)?.unwrap_or(0);
            let limit = count_arg("limit", limit)?;
            let max_units = count_arg("maxUnits", max_units)?.map(|u| u as usize);
            self.world.list_packed(t, run_id, after, limit, max_units)
        })
    }

    /// What was committed since `since` (a mark an earlier call returned; none for the first):
    /// `{"mark":…,"streams":[…]}`, `streams` null when anything may have changed.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn changes(&self, env: Env, since: Option<f64>) -> napi::Result<RawValue> {
        self.submit(&env, |t| {
            let since = count_arg("since", since)?.map(|m| m as i64);
            self.world.changes(t, since)
        })
    }

    /// Whether this world hears of other processes' commits as they happen (a `postgres` world,
    /// through the database's notifications).
    #[napi(getter)]
    pub fn announces(&self) -> bool {
        self.world.announces()
    }

    /// The streams of the next commit announced (empty: any may have changed), or `null` once
    /// `timeoutMs` has passed without one.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn next_announcement(&self, env: Env, timeout_ms: f64) -> napi::Result<RawValue> {
        self.submit(&env, |t| {
            let ms = count_arg("timeoutMs", Some(timeout_ms))?.unwrap_or(0);
            self.world.next_announcement(t, Duration::from_millis(ms.min(60_000)))
        })
    }

    /// Stop accepting work; resolves once every queued append has committed.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn close(&self, env: Env) -> napi::Result<RawValue> {
        self.submit(&env, |t| self.world.close(t))
    }
}
