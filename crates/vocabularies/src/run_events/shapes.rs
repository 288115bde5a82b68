//! Every event type of the sister engine's `RunEvent` and `SessionEvent` unions, with its fields,
//! the stream(s) it may be carried on, and its cross-field refinements.
//!
//! Stream membership follows how the engine correlates events and namespaces session events: the `agent:token` / `agent:reasoning` / `agent:tool_call` / `agent:tool_result` /
//! `cost:updated` / `agent:approval_requested` / `budget:estimate_committed` events are
//! dual-envelope; `agent:file_patch_proposed` and `cost:attempt_settled` are run-only like the rest
//! of the run union; `session:*` is session-only. One reserved type is declared too:
//! `budget:estimate_released`, whose fields are settled and whose amount the
//! conservative restore subtracts ("sum, less any release"); it carries the commit's envelope, so
//! it is dual-envelope like `budget:estimate_committed`. The other reserved names (`iteration:*`,
//! steering) have no settled fields and stay unknown.
//!
//! `node:completed.output` and `agent:tool_call.toolInput` are typed `unknown` by the engine: a
//! producer's `undefined` is an absent key once serialized, so they are optional here.

use super::refine::*;
use crate::rules::{opt, req, Field, Rule::*};
use little_world_kernel::error::Result;
use serde_json::{Map, Value};

/// A cross-field refinement of a shape, run after its fields check out.
pub(super) type Refine = fn(&Map<String, Value>) -> Result<()>;

/// Which stream(s) a type may be appended to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Carried {
    Run,
    Session,
    Both,
}

/// A known type: where it may go, its fields (in groups so common ones are written once), and
/// an optional refinement run after the fields check out.
pub(super) struct Shape {
    pub carried: Carried,
    pub fields: &'static [&'static [Field]],
    pub refine: Option<Refine>,
}

/// The closed `ErrorCode` taxonomy of the run events.
pub(super) const ERROR_CODES: &[&str] = &[
    "validation",
    "content_filter",
    "provider_auth",
    "provider_rate_limit",
    "provider_unavailable",
    "tool_denied",
    "tool_failed",
    "tool_unavailable",
    "budget_exceeded",
    "effect_needs_attention",
    "run_timeout",
    "turn_limit",
    "cancelled",
    "sandbox_error",
    "internal",
];

/// The session turn's stop reasons: the five LLM `StopReason`s plus the session-only `aborted`.
/// The five are the sister engine's `STOP_REASONS`.
pub(super) const SESSION_STOP_REASONS: &[&str] = &["stop", "length", "tool_use", "content_filter", "error", "aborted"];

const NODE: &[Field] = &[req("nodeId", NonEmpty)];
const WITHIN_CHAIN: &[Field] = &[opt("attemptNumber", Positive)];
const ERROR_BODY: &[Field] = &[
    req("error.code", OneOf(ERROR_CODES)),
    req("error.message", Str),
    req("error.retryable", Bool),
];
const ERROR_REQ: &[Field] = &[req("error", Object)];
const CORRELATION: &[Field] = &[opt("error.correlationId", NonEmpty)];
const TOKENS: &[Field] = &[
    req("tokensUsed", Object),
    req("tokensUsed.input", Count),
    req("tokensUsed.output", Count),
    opt("tokensUsed.model", NonEmpty),
];
const NODE_SNAPSHOT: &[Field] = &[opt("attemptNumber", Positive), opt("cumulativeCostMicrocents", Count)];
const COST_FIELDS: &[Field] = &[
    req("model", NonEmpty),
    req("inputTokens", Count),
    req("outputTokens", Count),
    req("costMicrocents", Count),
    req("cumulativeCostMicrocents", Count),
];
const PATCH: &[Field] = &[req("uri", NonEmpty), req("unifiedDiff", Str)];
const COMPACTION: &[&str] = &["manual", "auto-threshold"];

const fn run(fields: &'static [&'static [Field]]) -> Shape {
    Shape {
        carried: Carried::Run,
        fields,
        refine: None,
    }
}

const fn both(fields: &'static [&'static [Field]]) -> Shape {
    Shape {
        carried: Carried::Both,
        fields,
        refine: None,
    }
}

const fn session(fields: &'static [&'static [Field]]) -> Shape {
    Shape {
        carried: Carried::Session,
        fields,
        refine: None,
    }
}

const fn refined(shape: Shape, refine: Refine) -> Shape {
    Shape {
        refine: Some(refine),
        ..shape
    }
}

/// Every known type, in the engine's order: the run union, the reserved release, the session union.
pub(super) static SHAPES: &[(&str, Shape)] = &[
    (
        "run:started",
        run(&[&[
            req("workflowId", Uuid),
            req("inputs", Object),
            req("executionMode", OneOf(&["local", "cloud", "managed"])),
        ]]),
    ),
    (
        "node:started",
        run(&[NODE, &[req("nodeType", NonEmpty), opt("attemptNumber", Positive)]]),
    ),
    (
        "agent:token",
        both(&[NODE, &[req("token", Str), req("model", NonEmpty)]]),
    ),
    (
        "agent:reasoning",
        both(&[NODE, &[req("text", Str), req("model", NonEmpty)]]),
    ),
    (
        "agent:tool_call",
        both(&[
            NODE,
            &[req("model", NonEmpty), req("toolId", NonEmpty), opt("toolInput", Any)],
            WITHIN_CHAIN,
        ]),
    ),
    (
        "agent:tool_result",
        both(&[
            NODE,
            &[req("toolId", NonEmpty), req("success", Bool), req("outputSummary", Str)],
            WITHIN_CHAIN,
        ]),
    ),
    (
        "agent:approval_requested",
        refined(
            both(&[
                NODE,
                &[
                    req("toolId", NonEmpty),
                    req("action", OneOf(&["fs_write", "process", "egress", "os"])),
                    req("preview", Object),
                    opt("preview.path", NonEmpty),
                    opt("preview.command", NonEmpty),
                    opt("preview.host", NonEmpty),
                ],
                WITHIN_CHAIN,
            ]),
            approval_preview,
        ),
    ),
    (
        "agent:file_patch_proposed",
        run(&[NODE, &[req("patches", Records(PATCH, 1))], WITHIN_CHAIN]),
    ),
    (
        "cost:updated",
        refined(
            both(&[NODE, COST_FIELDS, WITHIN_CHAIN, &[opt("priced", Bool)]]),
            unpriced_is_zero,
        ),
    ),
    (
        "node:completed",
        run(&[
            NODE,
            &[opt("output", Any)],
            TOKENS,
            &[req("durationMs", Count), opt("selected", Ids(0))],
            NODE_SNAPSHOT,
        ]),
    ),
    (
        "node:failed",
        run(&[NODE, ERROR_REQ, ERROR_BODY, CORRELATION, NODE_SNAPSHOT]),
    ),
    (
        "node:skipped",
        run(&[
            NODE,
            &[req("reason", OneOf(&["branch_not_taken", "upstream_unreachable"]))],
        ]),
    ),
    (
        "node:retrying",
        refined(
            run(&[
                NODE,
                &[req("attemptNumber", Positive)],
                ERROR_REQ,
                ERROR_BODY,
                &[req("delayMs", Count)],
            ]),
            retry_has_no_correlation,
        ),
    ),
    (
        "media_job:submitted",
        refined(
            run(&[
                NODE,
                &[
                    req("jobId", NonEmpty),
                    req("provider", OneOf(&["anthropic", "openai", "gemini", "deepseek"])),
                    req("model", NonEmpty),
                    req("modality", OneOf(&["image", "audio", "video"])),
                    req("startedAt", Instant),
                    req("deadlineAt", Instant),
                    opt("units", Number),
                    opt("acceptedCostMicrocents", Count),
                ],
            ]),
            media_basis,
        ),
    ),
    (
        "human_gate:paused",
        refined(
            run(&[
                NODE,
                &[
                    req("gateId", NonEmpty),
                    req("gateType", OneOf(&["approval", "input", "review"])),
                    req("message", Str),
                    opt("assignee", Str),
                    opt("timeoutMs", Count),
                    opt("timeoutAction", OneOf(&["approve", "reject"])),
                    opt("expiresAt", Instant),
                ],
            ]),
            timeout_action_needs_timeout,
        ),
    ),
    (
        "human_gate:resumed",
        run(&[
            NODE,
            &[
                req("decision", OneOf(&["approved", "rejected", "input_provided"])),
                req("decidedBy", NonEmpty),
                opt("payload", Any),
            ],
        ]),
    ),
    (
        "run:completed",
        run(&[&[
            req("outputs", Object),
            req("totalTokensUsed", Object),
            req("totalTokensUsed.input", Count),
            req("totalTokensUsed.output", Count),
            req("totalCostMicrocents", Count),
            req("durationMs", Count),
        ]]),
    ),
    (
        "run:failed",
        run(&[
            ERROR_REQ,
            ERROR_BODY,
            CORRELATION,
            &[
                opt("error.nodeId", NonEmpty),
                req("partialOutputs", Object),
                opt("cumulativeCostMicrocents", Count),
            ],
        ]),
    ),
    ("run:cancelled", run(&[&[opt("cumulativeCostMicrocents", Count)]])),
    (
        "run:paused",
        refined(
            run(&[&[
                req("pendingGateCount", Count),
                req("gateIds", Ids(0)),
                opt("pendingMediaJobNodeIds", Ids(0)),
            ]]),
            paused_aggregate,
        ),
    ),
    (
        "run:timeout",
        run(&[&[req("elapsedMs", Count), req("timeoutMs", Count)]]),
    ),
    (
        "budget:warning",
        run(&[&[
            req("spentMicrocents", Count),
            req("limitMicrocents", Count),
            req("thresholdPct", Pct),
        ]]),
    ),
    (
        "budget:paused",
        run(&[
            NODE,
            &[
                req("spentMicrocents", Count),
                req("limitMicrocents", Count),
                req("gateId", NonEmpty),
            ],
        ]),
    ),
    (
        "budget:estimate_committed",
        refined(
            both(&[
                &[opt("nodeId", NonEmpty)],
                WITHIN_CHAIN,
                &[
                    req("model", NonEmpty),
                    req("estimateMicrocents", Positive),
                    req("cumulativeConservativeMicrocents", Count),
                ],
            ]),
            cumulative_covers_estimate,
        ),
    ),
    (
        "cost:attempt_settled",
        refined(
            run(&[
                NODE,
                COST_FIELDS,
                &[req("attemptNumber", Positive), req("priced", Bool)],
            ]),
            unpriced_is_zero,
        ),
    ),
    (
        "budget:estimate_released",
        both(&[
            &[opt("nodeId", NonEmpty)],
            WITHIN_CHAIN,
            &[
                req("model", NonEmpty),
                req("releasedMicrocents", Positive),
                req("cumulativeConservativeMicrocents", Count),
            ],
        ]),
    ),
    (
        "session:started",
        session(&[&[
            req("agentRef", NonEmpty),
            req("model", NonEmpty),
            req("context", Object),
        ]]),
    ),
    ("session:turn_started", session(&[])),
    (
        "session:turn_completed",
        refined(
            session(&[
                &[req("stopReason", OneOf(SESSION_STOP_REASONS))],
                TOKENS,
                &[opt("error", Object)],
                ERROR_BODY,
                CORRELATION,
            ]),
            aborted_has_no_error,
        ),
    ),
    ("session:cancelled", session(&[])),
    ("session:exported", session(&[&[req("workflowPath", NonEmpty)]])),
    ("session:compacting", session(&[&[req("reason", OneOf(COMPACTION))]])),
    (
        "session:compacted",
        session(&[
            &[
                req("reason", OneOf(COMPACTION)),
                req("summary", Str),
                req("keptMessageCount", Count),
                req("tokensBefore", Count),
                req("tokensAfter", Count),
            ],
            TOKENS,
        ]),
    ),
    (
        "session:trimmed",
        session(&[&[
            req("reason", OneOf(&["manual", "auto-fallback"])),
            req("keptMessageCount", Count),
            req("droppedMessageCount", Count),
        ]]),
    ),
];

/// The shape of a known type.
pub(super) fn shape(t: &str) -> Option<&'static Shape> {
    SHAPES.iter().find(|(name, _)| *name == t).map(|(_, s)| s)
}
