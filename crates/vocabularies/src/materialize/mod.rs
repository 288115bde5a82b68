//! The materializer: a run's state, usage and priced cost, as a pure fold of its event log.
//!
//! The fold reads each envelope's canonical JSON without building a generic tree: the envelope
//! and the fields the state needs are deserialized straight from the text, outputs and errors are
//! kept as raw JSON slices, and artifact references are found by scanning the text. The same
//! events always give the same state, byte for byte, because the state is written as canonical
//! JSON and every sum is exact (see [`pricing`]).
//!
//! Rules (the contract's Materialization section):
//! - `RunStarted` / `RunCompleted` / `RunFailed` set the run's status (the latest wins, so a
//!   resumed run is running again); step and parallel events move steps; any of them moves a
//!   pending run to running; `OuterLoopCycleCompleted` with `supervise.kind: "done"` completes it.
//! - `harness.model.responded` is the only priced event: its usage is added to the run, to its
//!   model, and to the step named by `stepPath`.
//! - `harness.session.completed` usage is never added: it restates the session's model calls.
//! - `harness.session.started` is recorded per role; a later session of the same role with
//!   another `manifestHash`, or a hash that is not sha256 of the canonical manifest, is drift.

mod envelope;
mod priced;
pub mod pricing;
pub mod snapshot;
mod stored;

use envelope::{boxed, parse_envelope, without_extra_mistyped, Fields};
pub use priced::Priced;
pub use stored::fold_stored;

use little_world_kernel::canonical;
use little_world_kernel::error::{Result, WorldError};
use little_world_kernel::ids;
use pricing::{femto_to_usd, Femto, Pricing};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};

/// Token and cost totals of a scope (a run, a step, a model).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_input_tokens: u64,
    pub reasoning_tokens: u64,
    pub cost: Femto,
    pub priced_calls: u64,
    pub unpriced_calls: u64,
}

impl Usage {
    fn add_call(&mut self, tokens: &Tokens, cost: Option<Femto>) {
        self.input_tokens += tokens.input;
        self.output_tokens += tokens.output;
        self.cached_input_tokens += tokens.cached;
        self.reasoning_tokens += tokens.reasoning;
        match cost {
            Some(c) => {
                self.cost += c;
                self.priced_calls += 1;
            }
            None => self.unpriced_calls += 1,
        }
    }

    /// `costUsd`: `null` only when every call was unpriced, `0` only when there were no calls.
    pub fn cost_usd(&self) -> Option<f64> {
        if self.priced_calls == 0 && self.unpriced_calls > 0 {
            None
        } else {
            Some(femto_to_usd(self.cost))
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens,
            "cachedInputTokens": self.cached_input_tokens,
            "reasoningTokens": self.reasoning_tokens,
            "costUsd": self.cost_usd(),
            "pricedCalls": self.priced_calls,
            "unpricedCalls": self.unpriced_calls,
        })
    }
}

struct Tokens {
    input: u64,
    output: u64,
    cached: u64,
    reasoning: u64,
}

#[derive(Debug, Default)]
struct Step {
    kind: Option<String>,
    status: &'static str,
    attempts: u64,
    started_at: Option<String>,
    finished_at: Option<String>,
    output: Option<Box<RawValue>>,
    output_ref: Option<String>,
    error: Option<Box<RawValue>>,
    group_id: Option<String>,
    usage: Usage,
}

struct Session {
    sequence: u64,
    role: String,
    run_id: String,
    manifest_hash: String,
    status: &'static str,
}

/// The fold's accumulator.
pub struct Fold<'p> {
    run_id: String,
    pricing: &'p Pricing,
    workflow_version_id: Option<String>,
    status: &'static str,
    started_at: Option<String>,
    finished_at: Option<String>,
    output: Option<Box<RawValue>>,
    output_ref: Option<String>,
    error: Option<Box<RawValue>>,
    usage: Usage,
    by_model: BTreeMap<String, Usage>,
    steps: BTreeMap<String, Step>,
    artifacts: Vec<String>,
    seen_artifacts: HashSet<String>,
    sessions: Vec<Session>,
    drift: Vec<Value>,
    outer_loop: Option<Value>,
    event_count: u64,
    last_recorded_at: Option<String>,
    /// The event id of the last event folded, which a snapshot of this state names.
    last_event_id: String,
}

impl<'p> Fold<'p> {
    /// An empty fold of `run_id`, pricing calls with `pricing`.
    pub fn new(run_id: &str, pricing: &'p Pricing) -> Self {
        Fold {
            run_id: run_id.to_string(),
            pricing,
            workflow_version_id: None,
            status: "pending",
            started_at: None,
            finished_at: None,
            output: None,
            output_ref: None,
            error: None,
            usage: Usage::default(),
            by_model: BTreeMap::new(),
            steps: BTreeMap::new(),
            artifacts: Vec::new(),
            seen_artifacts: HashSet::new(),
            sessions: Vec::new(),
            drift: Vec::new(),
            outer_loop: None,
            event_count: 0,
            last_recorded_at: None,
            last_event_id: String::new(),
        }
    }

    /// Fold one envelope, given as JSON text.
    pub fn push(&mut self, envelope_json: &str) -> Result<()> {
        let env = parse_envelope(&self.run_id, self.event_count + 1, envelope_json)?;
        self.apply(
            &env.run_id,
            env.sequence,
            &env.event_id,
            &env.event_type,
            &env.recorded_at,
            env.payload.get(),
        )
    }

    /// Fold one event of a parsed envelope: its run, sequence, event id, type, `recordedAt` and
    /// payload.
    fn apply(&mut self, run_id: &str, sequence: u64, event_id: &str, t: &str, at: &str, payload: &str) -> Result<()> {
        let expected = self.event_count + 1;
        if run_id != self.run_id {
            return Err(self.corrupt(expected, format!("envelope belongs to {run_id}")));
        }
        if sequence != expected {
            return Err(self.corrupt(expected, format!("found sequence {sequence}; the log is not dense")));
        }
        self.event_count = expected;
        self.last_event_id.clear();
        self.last_event_id.push_str(event_id);
        self.collect_artifacts(payload);
        if !is_folded(t) {
            self.last_recorded_at = Some(at.to_string());
            return Ok(());
        }
        // Read past extra fields of another type than the fold reads them as (see `Fields`).
        // serde's message would quote a value, so it is not used.
        let readable;
        let f: Fields<'_> = match serde_json::from_str(payload) {
            Ok(f) => f,
            Err(_) => {
                readable = without_extra_mistyped(t, payload).map_err(|why| self.corrupt(expected, why))?;
                serde_json::from_str(&readable)
                    .map_err(|_| self.corrupt(expected, format!("the {t} payload does not read")))?
            }
        };
        match t {
            "RunStarted" => {
                self.status = "running";
                self.started_at.get_or_insert_with(|| at.to_string());
                self.finished_at = None;
                self.error = None;
                if let Some(v) = f.workflow_version_id {
                    self.workflow_version_id = Some(v.into_owned());
                }
            }
            "RunCompleted" => {
                self.finish("completed", at);
                self.output = f.output.map(boxed);
                self.output_ref = f.output_ref.map(Cow::into_owned);
                self.error = None;
            }
            "RunFailed" => {
                self.finish("failed", at);
                self.error = f.error.map(boxed);
            }
            "OuterLoopCycleCompleted" => {
                let kind = f.supervise.as_ref().map_or("", |s| s.kind.as_ref()).to_string();
                if kind == "done" {
                    self.finish("completed", at);
                    if let Some(out) = f.supervise.as_ref().and_then(|s| s.final_output) {
                        self.output = Some(boxed(out));
                    }
                } else {
                    self.touch_run(at);
                }
                self.outer_loop = Some(json!({
                    "outerLoopId": f.outer_loop_id.as_deref().unwrap_or(""),
                    "cycleNumber": f.cycle_number.unwrap_or(0),
                    "lastKind": kind,
                }));
            }
            "harness.session.started" => self.session_started(expected, &f)?,
            "harness.session.completed" | "harness.session.failed" => {
                let status = if t.ends_with("completed") {
                    "completed"
                } else {
                    "failed"
                };
                let run = f.run_id.as_deref().unwrap_or("");
                if let Some(s) = self
                    .sessions
                    .iter_mut()
                    .rev()
                    .find(|s| s.run_id == run && s.status == "running")
                {
                    s.status = status;
                }
                // The session's usage rollup restates its model calls: never added.
            }
            "harness.model.responded" => self.model_responded(expected, at, &f)?,
            _ => self.step_event(t, &f, at),
        }
        self.last_recorded_at = Some(at.to_string());
        Ok(())
    }

    fn corrupt(&self, sequence: u64, reason: String) -> WorldError {
        WorldError::EventLogCorrupt {
            run_id: Some(self.run_id.clone()),
            sequence: Some(sequence),
            reason,
        }
    }

    fn finish(&mut self, status: &'static str, at: &str) {
        self.status = status;
        self.finished_at = Some(at.to_string());
    }

    fn touch_run(&mut self, at: &str) {
        if self.status == "pending" {
            self.status = "running";
            self.started_at.get_or_insert_with(|| at.to_string());
        }
    }

    fn step(&mut self, path: &str) -> &mut Step {
        self.steps.entry(path.to_string()).or_insert_with(|| Step {
            status: "pending",
            ..Step::default()
        })
    }

    fn step_event(&mut self, t: &str, f: &Fields<'_>, at: &str) {
        let Some(path) = f.step_path.as_deref() else { return };
        self.touch_run(at);
        let kind = match t {
            _ if t.starts_with("ParallelGroup") => Some("parallel.group"),
            _ if t.starts_with("ParallelBranch") => Some("parallel.branch"),
            _ => None,
        };
        let step = self.step(path);
        if let Some(k) = kind {
            step.kind = Some(k.to_string());
        } else if let Some(k) = &f.step_kind {
            step.kind = Some(k.to_string());
        }
        if let Some(g) = &f.group_id {
            step.group_id = Some(g.to_string());
        }
        match t {
            "StepStarted" | "ParallelGroupStarted" | "ParallelBranchScheduled" => {
                step.status = "running";
                step.attempts += 1;
                step.started_at.get_or_insert_with(|| at.to_string());
                step.finished_at = None;
                step.error = None;
            }
            "StepCompleted" | "ParallelGroupCompleted" | "ParallelBranchCompleted" => {
                step.status = "completed";
                step.finished_at = Some(at.to_string());
                step.error = None;
                step.output = f.output.map(boxed);
                step.output_ref = f.output_ref.as_deref().map(str::to_string);
            }
            "StepFailed" | "ParallelGroupFailed" | "ParallelBranchFailed" => {
                step.status = "failed";
                step.finished_at = Some(at.to_string());
                step.error = f.error.map(boxed);
            }
            _ => {}
        }
    }

    fn session_started(&mut self, sequence: u64, f: &Fields<'_>) -> Result<()> {
        let role = f.role.as_deref().unwrap_or("").to_string();
        let hash = f.manifest_hash.as_deref().unwrap_or("").to_string();
        if let Some(manifest) = f.manifest {
            let value: Value =
                canonical::parse(manifest.get()).map_err(|e| self.corrupt(sequence, format!("the manifest {e}")))?;
            let expected = ids::sha256_tagged(canonical::to_string(&value).as_bytes());
            if expected != hash {
                self.drift.push(json!({
                    "sequence": sequence, "role": role, "reason": "hash-mismatch",
                    "manifestHash": hash, "expected": expected,
                }));
            }
        }
        if let Some(prev) = self.sessions.iter().rev().find(|s| s.role == role) {
            if prev.manifest_hash != hash {
                self.drift.push(json!({
                    "sequence": sequence, "role": role, "reason": "changed",
                    "manifestHash": hash, "expected": prev.manifest_hash,
                }));
            }
        }
        self.sessions.push(Session {
            sequence,
            role,
            run_id: f.run_id.as_deref().unwrap_or("").to_string(),
            manifest_hash: hash,
            status: "running",
        });
        Ok(())
    }

    /// Price a model call by the registry entry in effect at `at`, when it was recorded.
    fn model_responded(&mut self, sequence: u64, at: &str, f: &Fields<'_>) -> Result<()> {
        let (Some(model), Some(usage)) = (&f.model, f.response.as_ref().and_then(|r| r.usage.as_ref())) else {
            return Err(self.corrupt(
                sequence,
                "harness.model.responded without model or response.usage".into(),
            ));
        };
        let tokens = Tokens {
            input: usage.input_tokens,
            output: usage.output_tokens,
            cached: usage.cached_input_tokens,
            reasoning: usage.reasoning_tokens,
        };
        // Sums are exact: the run's totals (of which every other usage is a part) stay within
        // what a JavaScript number holds exactly.
        let run = &self.usage;
        let max = little_world_kernel::numbers::MAX_SAFE_INTEGER as u64;
        let exceeds = |sum: u64, add: u64| sum.checked_add(add).is_none_or(|s| s > max);
        if exceeds(run.input_tokens, tokens.input)
            || exceeds(run.output_tokens, tokens.output)
            || exceeds(run.cached_input_tokens, tokens.cached)
            || exceeds(run.reasoning_tokens, tokens.reasoning)
        {
            return Err(self.corrupt(
                sequence,
                "the run's token counts add up to more than 2^53 - 1, past what a number holds exactly".into(),
            ));
        }
        let cost = self
            .pricing
            .rates_at(&model.provider, &model.model_id, at)
            .map(|r| r.cost(tokens.input, tokens.cached, tokens.output));
        self.usage.add_call(&tokens, cost);
        self.by_model
            .entry(model_key(&model.provider, &model.model_id))
            .or_default()
            .add_call(&tokens, cost);
        if let Some(path) = f.step_path.as_deref() {
            let step = self.step(path);
            if step.status == "pending" {
                step.status = "running";
            }
            step.usage.add_call(&tokens, cost);
        }
        Ok(())
    }

    /// Record every string in the payload that is exactly an artifact reference. The text is
    /// canonical (or `JSON.stringify`'s), so a string value starts with a quote that follows one
    /// of `[ , : {`, and a reference needs no escapes.
    fn collect_artifacts(&mut self, text: &str) {
        const NEEDLE: &str = "\"artifact://art_";
        static FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
            std::sync::LazyLock::new(|| memchr::memmem::Finder::new(NEEDLE));
        let bytes = text.as_bytes();
        for i in FINDER.find_iter(bytes) {
            let end = i + NEEDLE.len() + 16;
            if end >= bytes.len()
                || bytes[end] != b'"'
                || !matches!(bytes.get(i.wrapping_sub(1)), Some(b'[' | b',' | b':' | b'{'))
            {
                continue;
            }
            if bytes.get(end + 1) == Some(&b':') {
                continue; // a key, not a value
            }
            let reference = &text[i + 1..end];
            if little_world_kernel::ids::is_artifact_ref(reference) && self.seen_artifacts.insert(reference.to_string())
            {
                self.artifacts.push(reference.to_string());
            }
        }
    }

    /// The state as a JSON value.
    pub fn state(&self) -> Value {
        let mut s = Map::new();
        s.insert("runId".into(), json!(self.run_id));
        s.insert("status".into(), json!(self.status));
        s.insert("eventCount".into(), json!(self.event_count));
        s.insert("usage".into(), self.usage.to_json());
        s.insert(
            "usageByModel".into(),
            Value::Object(self.by_model.iter().map(|(k, u)| (k.clone(), u.to_json())).collect()),
        );
        s.insert("artifacts".into(), json!(self.artifacts));
        s.insert(
            "steps".into(),
            Value::Object(self.steps.iter().map(|(k, st)| (k.clone(), step_json(k, st))).collect()),
        );
        s.insert(
            "sessions".into(),
            Value::Array(
                self.sessions
                    .iter()
                    .map(|x| json!({"sequence": x.sequence, "role": x.role, "runId": x.run_id, "manifestHash": x.manifest_hash, "status": x.status}))
                    .collect(),
            ),
        );
        s.insert("manifestDrift".into(), Value::Array(self.drift.clone()));
        let opt = |s: &mut Map<String, Value>, k: &str, v: Option<Value>| {
            if let Some(v) = v {
                s.insert(k.into(), v);
            }
        };
        opt(
            &mut s,
            "workflowVersionId",
            self.workflow_version_id.as_ref().map(|v| json!(v)),
        );
        opt(&mut s, "startedAt", self.started_at.as_ref().map(|v| json!(v)));
        opt(&mut s, "finishedAt", self.finished_at.as_ref().map(|v| json!(v)));
        opt(
            &mut s,
            "lastRecordedAt",
            self.last_recorded_at.as_ref().map(|v| json!(v)),
        );
        opt(&mut s, "output", self.output.as_deref().map(raw_value));
        opt(&mut s, "outputRef", self.output_ref.as_ref().map(|v| json!(v)));
        opt(&mut s, "error", self.error.as_deref().map(raw_value));
        opt(&mut s, "outerLoop", self.outer_loop.clone());
        opt(&mut s, "pricingAsOf", self.pricing.as_of.as_ref().map(|v| json!(v)));
        Value::Object(s)
    }

    /// The state as canonical JSON.
    pub fn state_json(&self) -> String {
        canonical::to_string(&self.state())
    }
}

/// A value of a parsed envelope. It nests at most 1,000 levels (appends refuse deeper payloads,
/// and [`fold_events_json`] deeper envelopes), deeper than serde_json's default limit of 128.
fn raw_value(raw: &RawValue) -> Value {
    canonical::parse(raw.get()).expect("a value of an envelope that parsed")
}

fn step_json(path: &str, st: &Step) -> Value {
    let mut m = Map::new();
    m.insert("stepPath".into(), json!(path));
    m.insert("status".into(), json!(st.status));
    m.insert("attempts".into(), json!(st.attempts));
    m.insert("usage".into(), st.usage.to_json());
    if let Some(k) = &st.kind {
        m.insert("stepKind".into(), json!(k));
    }
    if let Some(g) = &st.group_id {
        m.insert("groupId".into(), json!(g));
    }
    if let Some(v) = &st.started_at {
        m.insert("startedAt".into(), json!(v));
    }
    if let Some(v) = &st.finished_at {
        m.insert("finishedAt".into(), json!(v));
    }
    if let Some(v) = &st.output {
        m.insert("output".into(), raw_value(v));
    }
    if let Some(v) = &st.output_ref {
        m.insert("outputRef".into(), json!(v));
    }
    if let Some(v) = &st.error {
        m.insert("error".into(), raw_value(v));
    }
    Value::Object(m)
}

/// Types whose payload the fold reads; every other type only counts (and may reference artifacts).
fn is_folded(t: &str) -> bool {
    matches!(
        t,
        "RunStarted"
            | "RunCompleted"
            | "RunFailed"
            | "StepStarted"
            | "StepCompleted"
            | "StepFailed"
            | "ParallelGroupStarted"
            | "ParallelGroupCompleted"
            | "ParallelGroupFailed"
            | "ParallelBranchScheduled"
            | "ParallelBranchCompleted"
            | "ParallelBranchFailed"
            | "OuterLoopCycleCompleted"
            | "harness.session.started"
            | "harness.session.completed"
            | "harness.session.failed"
            | "harness.model.responded"
    )
}

/// Fold a JSON array of envelopes (as `materializeRunStateFromEvents` receives them).
pub fn fold_events_json(run_id: &str, events_json: &str, pricing: &Pricing) -> Result<String> {
    ids::check_stream_id(run_id)?;
    // An envelope's payload may nest 1,000 levels, inside the envelope and the array.
    canonical::check_depth(events_json, 2).map_err(|e| WorldError::EventLogCorrupt {
        run_id: Some(run_id.to_string()),
        sequence: None,
        reason: format!("an envelope's payload {e}"),
    })?;
    let events: Vec<&RawValue> = serde_json::from_str(events_json).map_err(|e| WorldError::EventLogCorrupt {
        run_id: Some(run_id.to_string()),
        sequence: None,
        reason: format!("expected an array of envelopes: {e}"),
    })?;
    let mut fold = Fold::new(run_id, pricing);
    for e in events {
        fold.push(e.get())?;
    }
    Ok(fold.state_json())
}

/// The key of a model in `usageByModel`: `provider/modelId`, with each `%` and `/` of the
/// provider written `%25` and `%2F`, so that the first `/` always ends the provider and two
/// models never share a key (`openrouter` + `meta/llama` is `openrouter/meta/llama`,
/// `openrouter/meta` + `llama` is `openrouter%2Fmeta/llama`).
pub fn model_key(provider: &str, model_id: &str) -> String {
    let mut key = String::with_capacity(provider.len() + model_id.len() + 1);
    for c in provider.chars() {
        match c {
            '%' => key.push_str("%25"),
            '/' => key.push_str("%2F"),
            c => key.push(c),
        }
    }
    key.push('/');
    key.push_str(model_id);
    key
}

#[cfg(test)]
mod tests;
