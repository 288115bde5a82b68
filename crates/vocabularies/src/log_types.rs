//! The event log's own vocabulary: the payload shapes of its known types (`RunStarted`,
//! `StepCompleted`, `harness.model.responded`, ...), the fields stored as artifacts when large,
//! and the token counts a model call adds to its run.
//!
//! Each known type lists its required and optional fields with a rule per field, in the rule
//! language every vocabulary shares ([`crate::rules`]). Extra fields are
//! always allowed, because a newer runtime may add some. A missing or mistyped field is an
//! `EventValidationError` whose path names it (`payload.response.usage.inputTokens`). A type it
//! does not know is stored as a generic fact.

use crate::rules::{check, check_fields, opt, req, Field, Rule};
use little_world_kernel::catalog::StatusChange;
use little_world_kernel::error::{Result, WorldError};
use little_world_kernel::json_path::dotted;
use little_world_kernel::vocabulary::{Effects, Spillable, Stream, Usage};
use serde_json::{Map, Value};

/// Fields of which a payload must (or may) carry exactly one, such as `output` / `outputRef`.
struct Choice {
    value: &'static str,
    reference: &'static str,
    required: bool,
}

const HARNESS_ROLES: &[&str] = &[
    "planner",
    "orchestrator",
    "worker.ai-generate",
    "worker.code-run",
    "worker.tool-call",
    "fixer",
];

struct Shape {
    fields: &'static [Field],
    choice: Option<Choice>,
}

const OUTPUT_OPTIONAL: Option<Choice> = Some(Choice {
    value: "output",
    reference: "outputRef",
    required: false,
});

/// Every known `appendEvent` type with its shape.
static SHAPES: &[(&str, Shape)] = {
    use Rule::*;
    &[
        (
            "RunStarted",
            Shape {
                fields: &[opt("workflowVersionId", Str), opt("input", Any)],
                choice: None,
            },
        ),
        (
            "RunCompleted",
            Shape {
                fields: &[],
                choice: OUTPUT_OPTIONAL,
            },
        ),
        (
            "RunFailed",
            Shape {
                fields: &[req("error", Error)],
                choice: None,
            },
        ),
        (
            "StepStarted",
            Shape {
                fields: &[
                    req("stepPath", NonEmpty),
                    opt("stepKind", Str),
                    opt("attempt", Positive),
                ],
                choice: None,
            },
        ),
        (
            "StepCompleted",
            Shape {
                fields: &[req("stepPath", NonEmpty)],
                choice: OUTPUT_OPTIONAL,
            },
        ),
        (
            "StepFailed",
            Shape {
                fields: &[req("stepPath", NonEmpty), req("error", Error)],
                choice: None,
            },
        ),
        (
            "ParallelGroupStarted",
            Shape {
                fields: &[
                    req("stepPath", NonEmpty),
                    opt("groupId", Str),
                    opt("branchCount", Count),
                ],
                choice: None,
            },
        ),
        (
            "ParallelGroupCompleted",
            Shape {
                fields: &[
                    req("stepPath", NonEmpty),
                    opt("groupId", Str),
                    opt("branchCount", Count),
                ],
                choice: None,
            },
        ),
        (
            "ParallelGroupFailed",
            Shape {
                fields: &[req("stepPath", NonEmpty), opt("groupId", Str), opt("error", Error)],
                choice: None,
            },
        ),
        (
            "ParallelBranchScheduled",
            Shape {
                fields: &[req("stepPath", NonEmpty), opt("groupId", Str), opt("branch", Label)],
                choice: None,
            },
        ),
        (
            "ParallelBranchCompleted",
            Shape {
                fields: &[req("stepPath", NonEmpty), opt("groupId", Str), opt("branch", Label)],
                choice: None,
            },
        ),
        (
            "ParallelBranchFailed",
            Shape {
                fields: &[
                    req("stepPath", NonEmpty),
                    opt("groupId", Str),
                    opt("branch", Label),
                    opt("error", Error),
                ],
                choice: None,
            },
        ),
        (
            "OuterLoopCycleCompleted",
            Shape {
                fields: &[
                    req("outerLoopId", NonEmpty),
                    req("cycleNumber", Positive),
                    req("supervise", Object),
                    req("supervise.kind", OneOf(&["done", "continue"])),
                    opt("supervise.finalOutput", Any),
                    opt("supervise.promptNote", Str),
                ],
                choice: None,
            },
        ),
        (
            "harness.session.started",
            Shape {
                fields: &[
                    req("runId", NonEmpty),
                    req("role", OneOf(HARNESS_ROLES)),
                    req("task", Object),
                    req("task.kind", NonEmpty),
                    req("manifest", Object),
                    req("manifestHash", NonEmpty),
                    opt("parentRunId", NonEmpty),
                ],
                choice: None,
            },
        ),
        (
            "harness.session.completed",
            Shape {
                fields: &[
                    req("runId", NonEmpty),
                    req("usage", Object),
                    req("usage.inputTokens", Count),
                    req("usage.outputTokens", Count),
                    req("usage.cachedInputTokens", Count),
                    req("usage.reasoningTokens", Count),
                    opt("output", Any),
                    opt("fixedSource", Str),
                ],
                choice: None,
            },
        ),
        (
            "harness.session.failed",
            Shape {
                fields: &[req("runId", NonEmpty), req("error", Error)],
                choice: None,
            },
        ),
        (
            "harness.model.called",
            Shape {
                fields: &[
                    req("turn", Positive),
                    req("promptHash", NonEmpty),
                    req("request", Object),
                    req("request.model", NonEmpty),
                    req("request.messages", Array),
                    req("request.tools", Array),
                ],
                choice: None,
            },
        ),
        (
            "harness.model.responded",
            Shape {
                fields: &[
                    req("turn", Positive),
                    req("callId", NonEmpty),
                    opt("stepPath", NonEmpty),
                    req("model", Object),
                    req("model.provider", NonEmpty),
                    req("model.modelId", NonEmpty),
                    req("response", Object),
                    opt("response.text", Str),
                    opt("response.toolCalls", Array),
                    req("response.usage", Object),
                    req("response.usage.inputTokens", Count),
                    req("response.usage.outputTokens", Count),
                    opt("response.usage.cachedInputTokens", Count),
                    opt("response.usage.reasoningTokens", Count),
                ],
                choice: None,
            },
        ),
        (
            "harness.tool_call.started",
            Shape {
                fields: &[
                    opt("turn", Positive),
                    req("callId", NonEmpty),
                    req("caller", OneOf(&["model", "code"])),
                    req("toolName", NonEmpty),
                ],
                choice: Some(Choice {
                    value: "args",
                    reference: "argsRef",
                    required: true,
                }),
            },
        ),
        (
            "harness.tool_call.succeeded",
            Shape {
                fields: &[req("callId", NonEmpty), req("durationMs", Number)],
                choice: Some(Choice {
                    value: "result",
                    reference: "resultRef",
                    required: true,
                }),
            },
        ),
        (
            "harness.tool_call.failed",
            Shape {
                fields: &[req("callId", NonEmpty), req("error", Error), req("durationMs", Number)],
                choice: None,
            },
        ),
        (
            "harness.execute_step.started",
            Shape {
                fields: &[
                    req("stepPath", NonEmpty),
                    req("stepKind", OneOf(&["code.run", "tool.call", "decision"])),
                    req("inputHash", NonEmpty),
                ],
                choice: None,
            },
        ),
        (
            "harness.execute_step.succeeded",
            Shape {
                fields: &[
                    req("stepPath", NonEmpty),
                    req("outputHash", NonEmpty),
                    req("durationMs", Number),
                ],
                choice: None,
            },
        ),
    ]
};

fn shape(event_type: &str) -> Option<&'static Shape> {
    SHAPES.iter().find(|(name, _)| *name == event_type).map(|(_, s)| s)
}

/// Every known type of the event log's own vocabulary, in the order of its table.
pub fn known_types() -> Vec<&'static str> {
    SHAPES.iter().map(|(name, _)| *name).collect()
}

/// Whether `event_type` is one of the known `appendEvent` types.
pub fn is_known(event_type: &str) -> bool {
    shape(event_type).is_some()
}

/// Whether known type `event_type` gives its payload a top-level field `name` (required or
/// optional), so that the field holding something else is a broken payload, not an extra field.
pub fn declares(event_type: &str, name: &str) -> bool {
    shape(event_type).is_some_and(|s| {
        s.fields.iter().any(|f| f.name.split('.').next() == Some(name))
            || s.choice
                .as_ref()
                .is_some_and(|c| c.value == name || c.reference == name)
    })
}

/// Validate the payload of a known type; unknown types pass (they are stored as generic facts).
pub fn validate(event_type: &str, payload: &Map<String, Value>) -> Result<()> {
    let Some(shape) = shape(event_type) else {
        return Ok(());
    };
    check_fields(event_type, payload, shape.fields, "payload")?;
    if let Some(choice) = &shape.choice {
        let has_value = payload.contains_key(choice.value);
        let has_ref = payload.contains_key(choice.reference);
        if has_value && has_ref {
            return Err(WorldError::validation(
                dotted("payload", choice.reference),
                format!(
                    "{event_type} carries either {} or {}, not both",
                    choice.value, choice.reference
                ),
            ));
        }
        if choice.required && !has_value && !has_ref {
            return Err(WorldError::validation(
                dotted("payload", choice.value),
                format!("{event_type} requires {} or {}", choice.value, choice.reference),
            ));
        }
        if let Some(r) = payload.get(choice.reference) {
            check(Rule::ArtifactRef, r, &dotted("payload", choice.reference), event_type)?;
        }
    }
    // Of every usage object: a part of a count cannot exceed it.
    let usage_at = match event_type {
        "harness.model.responded" => Some(("payload.response.usage", &payload["response"]["usage"])),
        "harness.session.completed" => Some(("payload.usage", &payload["usage"])),
        _ => None,
    };
    if let Some((at, usage)) = usage_at {
        subset(at, usage, "cachedInputTokens", "inputTokens")?;
        subset(at, usage, "reasoningTokens", "outputTokens")?;
    }
    Ok(())
}

/// The token counts a `harness.model.responded` payload adds to its run's totals, as the
/// materializer sums them: the store's four totals ([`little_world_kernel::vocabulary::USAGE_FIELDS`]) of
/// `response.usage`, the last two 0 when absent. `None` when the first two are not counts.
pub fn token_counts(payload: &Map<String, Value>) -> Option<[u64; 4]> {
    let usage = payload.get("response")?.get("usage")?;
    let count = |name: &str| usage.get(name).and_then(Value::as_u64);
    let optional = |name: &str| usage.get(name).map_or(Some(0), Value::as_u64);
    Some([
        count("inputTokens")?,
        count("outputTokens")?,
        optional("cachedInputTokens")?,
        optional("reasoningTokens")?,
    ])
}

fn subset(at: &str, usage: &Value, part: &str, whole: &str) -> Result<()> {
    if let (Some(p), Some(w)) = (usage.get(part).and_then(Value::as_f64), usage[whole].as_f64()) {
        if p > w {
            return Err(WorldError::validation(
                dotted(at, part),
                format!("{part} ({p}) cannot exceed {whole} ({w})"),
            ));
        }
    }
    Ok(())
}

/// The event log's own vocabulary, as the append rules call it.
pub struct LogTypes;

impl little_world_kernel::vocabulary::Vocabulary for LogTypes {
    fn knows(&self, t: &str) -> bool {
        is_known(t)
    }

    fn check(&self, _stream: Stream, t: &str, fields: &Map<String, Value>) -> Result<()> {
        validate(t, fields)
    }

    /// A harness fact is appended by a runtime that retries: it must say which request it is.
    fn requires_key(&self, t: &str) -> bool {
        t.starts_with("harness.")
    }

    fn effects(&self, _stream: Stream, t: &str, fields: &Map<String, Value>) -> Effects {
        Effects {
            usage: (t == "harness.model.responded")
                .then(|| token_counts(fields))
                .flatten()
                .map(|tokens| Usage {
                    tokens,
                    at: "payload.response.usage",
                }),
            ..Effects::default()
        }
    }

    fn spillable(&self, t: &str, fields: &Map<String, Value>) -> Option<Spillable> {
        let text = |k: &str| fields.get(k).and_then(Value::as_str).unwrap_or("");
        let (field, reference, step_path) = match t {
            "StepCompleted" => ("output", "outputRef", text("stepPath").to_string()),
            "RunCompleted" => ("output", "outputRef", "$run".to_string()),
            "harness.tool_call.started" => ("args", "argsRef", format!("tool_call/{}", text("callId"))),
            "harness.tool_call.succeeded" => ("result", "resultRef", format!("tool_call/{}", text("callId"))),
            _ => return None,
        };
        Some(Spillable {
            field,
            reference,
            step_path,
        })
    }

    fn effect_types(&self) -> &'static [&'static str] {
        &["harness.model.responded"]
    }

    /// Each model call's token counts, as the materializer reads them (a row an earlier version
    /// stored without validation counts when its first two counts are there).
    fn stored_effects(&self, _stream_id: &str, t: &str, fields: &Map<String, Value>) -> Effects {
        self.effects(Stream::Run, t, fields)
    }

    /// `RunStarted` is `running`, `RunCompleted` and a done `OuterLoopCycleCompleted` are
    /// `completed`, `RunFailed` is `failed`, and a step event naming its `stepPath` moves a
    /// pending run to `running`, as the materializer folds them.
    fn status_change(&self, _stream_id: &str, t: &str, payload: &Map<String, Value>) -> Option<StatusChange> {
        use StatusChange::{Keep, Set, Touch};
        Some(match t {
            "RunStarted" => Set("running"),
            "RunCompleted" => Set("completed"),
            "RunFailed" => Set("failed"),
            "OuterLoopCycleCompleted" => {
                let kind = payload
                    .get("supervise")
                    .and_then(|s| s.get("kind"))
                    .and_then(Value::as_str);
                if kind == Some("done") {
                    Set("completed")
                } else {
                    Touch
                }
            }
            t if STEP_TYPES.contains(&t) => {
                if payload.get("stepPath").is_some_and(Value::is_string) {
                    Touch
                } else {
                    Keep
                }
            }
            _ => return None,
        })
    }

    fn status_reads_payload(&self, t: &str) -> bool {
        t == "OuterLoopCycleCompleted" || STEP_TYPES.contains(&t)
    }
}

/// The step events, which move a pending run to running when they name a `stepPath`.
const STEP_TYPES: &[&str] = &[
    "StepStarted",
    "StepCompleted",
    "StepFailed",
    "ParallelGroupStarted",
    "ParallelGroupCompleted",
    "ParallelGroupFailed",
    "ParallelBranchScheduled",
    "ParallelBranchCompleted",
    "ParallelBranchFailed",
];

#[cfg(test)]
mod tests {
    use super::*;
    use little_world_kernel::vocabulary::Vocabulary;
    use serde_json::json;

    #[test]
    fn what_the_log_types_tell_the_kernel() {
        let fields = |v: Value| v.as_object().unwrap().clone();
        assert!(LogTypes.requires_key("harness.session.failed") && LogTypes.requires_key("harness.anything"));
        assert!(!LogTypes.requires_key("StepStarted"));
        let usage = LogTypes
            .stored_effects("run_a", "harness.model.responded", &fields(responded()))
            .usage
            .unwrap();
        assert_eq!((usage.tokens, usage.at), ([10, 5, 0, 0], "payload.response.usage"));
        let none = Map::new();
        assert_eq!(
            LogTypes.status_change("run_a", "RunStarted", &none),
            Some(StatusChange::Set("running"))
        );
        assert_eq!(
            LogTypes.status_change("run_a", "RunFailed", &none),
            Some(StatusChange::Set("failed"))
        );
        let step = fields(json!({"stepPath": "a"}));
        assert_eq!(
            LogTypes.status_change("run_a", "StepCompleted", &step),
            Some(StatusChange::Touch)
        );
        assert_eq!(
            LogTypes.status_change("run_a", "StepCompleted", &none),
            Some(StatusChange::Keep)
        );
        let done = fields(json!({"supervise": {"kind": "done"}}));
        assert_eq!(
            LogTypes.status_change("run_a", "OuterLoopCycleCompleted", &done),
            Some(StatusChange::Set("completed"))
        );
        assert!(
            LogTypes.status_reads_payload("OuterLoopCycleCompleted") && !LogTypes.status_reads_payload("RunStarted")
        );
        assert_eq!(LogTypes.status_change("run_a", "my.fact", &none), None);
    }

    fn check_payload(t: &str, v: Value) -> Result<()> {
        validate(t, v.as_object().unwrap())
    }

    fn path_of(r: Result<()>) -> String {
        match r.unwrap_err() {
            WorldError::Validation { path, .. } => path,
            e => panic!("not a validation error: {e}"),
        }
    }

    fn responded() -> Value {
        json!({
            "turn": 1, "callId": "c1", "model": {"provider": "openai", "modelId": "gpt-5"},
            "response": {"usage": {"inputTokens": 10, "outputTokens": 5}}
        })
    }

    #[test]
    fn model_responded_shape() {
        assert!(check_payload("harness.model.responded", responded()).is_ok());
        let mut v = responded();
        v["response"]["usage"]["inputTokens"] = json!(-1);
        assert_eq!(
            path_of(check_payload("harness.model.responded", v)),
            "payload.response.usage.inputTokens"
        );
        let mut v = responded();
        v["response"]["usage"]["outputTokens"] = json!(1.5);
        assert_eq!(
            path_of(check_payload("harness.model.responded", v)),
            "payload.response.usage.outputTokens"
        );
        let mut v = responded();
        v["response"]["usage"]["cachedInputTokens"] = json!(11);
        assert_eq!(
            path_of(check_payload("harness.model.responded", v)),
            "payload.response.usage.cachedInputTokens"
        );
        let mut v = responded();
        v["response"]["usage"]["reasoningTokens"] = json!(6);
        assert_eq!(
            path_of(check_payload("harness.model.responded", v)),
            "payload.response.usage.reasoningTokens"
        );
        let mut v = responded();
        v["model"].as_object_mut().unwrap().remove("modelId");
        assert_eq!(
            path_of(check_payload("harness.model.responded", v)),
            "payload.model.modelId"
        );
        let mut v = responded();
        v["response"]["usage"]["inputTokens"] = json!(9007199254740992u64);
        assert!(check_payload("harness.model.responded", v).is_err());
    }

    #[test]
    fn step_events() {
        assert!(check_payload("StepStarted", json!({"stepPath": "a"})).is_ok());
        assert_eq!(path_of(check_payload("StepStarted", json!({}))), "payload.stepPath");
        assert_eq!(
            path_of(check_payload("StepFailed", json!({"stepPath": "a", "error": {}}))),
            "payload.error"
        );
        assert!(check_payload("StepFailed", json!({"stepPath": "a", "error": {"message": "x"}})).is_ok());
        assert_eq!(
            path_of(check_payload(
                "StepCompleted",
                json!({"stepPath": "a", "output": 1, "outputRef": "artifact://art_0123456789abcdef"})
            )),
            "payload.outputRef"
        );
        assert_eq!(
            path_of(check_payload(
                "StepCompleted",
                json!({"stepPath": "a", "outputRef": "art_x"})
            )),
            "payload.outputRef"
        );
        assert!(check_payload("RunCompleted", json!({})).is_ok());
        assert_eq!(
            path_of(check_payload(
                "OuterLoopCycleCompleted",
                json!({"outerLoopId": "o", "cycleNumber": 1, "supervise": {"kind": "maybe"}})
            )),
            "payload.supervise.kind"
        );
    }

    #[test]
    fn tool_calls_need_args_or_ref() {
        let base = json!({"callId": "c", "caller": "code", "toolName": "t"});
        assert_eq!(
            path_of(check_payload("harness.tool_call.started", base.clone())),
            "payload.args"
        );
        let mut v = base.clone();
        v["args"] = json!(null);
        assert!(check_payload("harness.tool_call.started", v).is_ok());
        let mut v = base;
        v["caller"] = json!("human");
        v["args"] = json!({});
        assert_eq!(path_of(check_payload("harness.tool_call.started", v)), "payload.caller");
    }

    #[test]
    fn unknown_types_pass() {
        assert!(check_payload("my.custom.fact", json!({"anything": [1, 2]})).is_ok());
        assert!(!is_known("my.custom.fact"));
        assert!(is_known("harness.session.started"));
    }

    #[test]
    fn artifact_refs() {
        assert!(little_world_kernel::ids::is_artifact_ref(
            "artifact://art_0123456789abcdef"
        ));
        assert!(!little_world_kernel::ids::is_artifact_ref(
            "artifact://art_0123456789ABCDEF"
        ));
        assert!(!little_world_kernel::ids::is_artifact_ref(
            "artifact://art_0123456789abcde"
        ));
        assert!(!little_world_kernel::ids::is_artifact_ref(
            " artifact://art_0123456789abcdef"
        ));
    }
}
