//! What the kernel asks of a vocabulary of event types, and the registry it loops over.
//!
//! The kernel knows no event type by name. A vocabulary (the event log's own types, the run
//! events of a sister engine, the Workflow SDK's run statuses, the credential screen) implements
//! [`Vocabulary`] and is registered once per process with [`register`]; the append rules
//! ([`crate::events`]), the runs catalog ([`crate::catalog`]), the upgrades of stored
//! worlds and `verify` ask the registered vocabularies in turn, and none of them is named here.
//! A process that registers none stores every event as a generic fact.

use crate::catalog::StatusChange;
use crate::error::Result;
use crate::store::LogReader;
use serde_json::{Map, Value};
use std::sync::OnceLock;

/// Which stream an event type may be appended to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// A workflow run (`runId`).
    Run,
    /// An agent session (`sessionId`).
    Session,
}

/// A budget estimate an event commits or releases (see [`Effects::estimate`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Estimate {
    /// The model whose conservative bucket it changes.
    pub model: String,
    /// The field of the event holding the amount.
    pub field: &'static str,
    /// The amount, in micro-cents.
    pub amount: u64,
    /// Released (given back), or committed.
    pub released: bool,
}

/// What an accepted event asks the writer to keep beside its row, checked against what is
/// stored in the append's transaction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Effects {
    /// It ends its stream (`""`) or a node of it (the node's id): nothing may follow the first,
    /// and a node ends once.
    pub terminal: Option<String>,
    /// It commits or releases a budget estimate: a release may give back only what is open, and
    /// a commitment may not take the stream's open total past 2^53 - 1.
    pub estimate: Option<Estimate>,
    /// Its token counts, added to its run's: no total may pass 2^53 - 1.
    pub usage: Option<Usage>,
}

/// The names of a run's four token totals, as the stores keep them.
pub const USAGE_FIELDS: [&str; 4] = ["inputTokens", "outputTokens", "cachedInputTokens", "reasoningTokens"];

/// Token counts an event adds to its run's totals, in the order of [`USAGE_FIELDS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub tokens: [u64; 4],
    /// Where the counts are in the event (`payload.response.usage`), for the error that refuses
    /// a total past 2^53 - 1.
    pub at: &'static str,
}

/// A field of an event type that is stored as a `json` artifact when it is large, with a
/// reference in its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spillable {
    /// The field holding the value (`output`).
    pub field: &'static str,
    /// The field holding the reference instead (`outputRef`).
    pub reference: &'static str,
    /// The artifact's step path.
    pub step_path: String,
}

/// A vocabulary of event types. Every rule defaults to having no say: a vocabulary that only
/// screens ids, or only gives statuses, knows no type.
pub trait Vocabulary: Send + Sync {
    /// Whether `t` is one of its types, on some stream: an append of it is held to
    /// [`Vocabulary::check`] and takes its [`Vocabulary::effects`]. The first registered
    /// vocabulary that knows a type owns it.
    fn knows(&self, _t: &str) -> bool {
        false
    }
    /// Check the fields of an event of type `t` (one it knows) appended to `stream`. Errors name
    /// the fields from [`Vocabulary::root`].
    fn check(&self, _stream: Stream, _t: &str, _fields: &Map<String, Value>) -> Result<()> {
        Ok(())
    }
    /// Where the paths of its errors start: `payload` for a type appended with its payload,
    /// `event` for one whose checks also serve drafts (an append reports them under `payload`).
    fn root(&self) -> &'static str {
        "payload"
    }
    /// Whether it takes drafts: events given as one object whose `type` field names the type
    /// (`appendRunEvent`, `appendSessionEvent`). The first registered one that does takes them.
    /// Its types are held to it as drafts are, before an append's own type, index writes and
    /// key are checked; another vocabulary's types are held to it after those.
    fn takes_drafts(&self) -> bool {
        false
    }
    /// Whether an append of one of its types must not carry a credential in its stream id or its
    /// idempotency key (each registered vocabulary's [`Vocabulary::screen`] is asked).
    fn screens_ids(&self) -> bool {
        false
    }
    /// Whether an append of `t`, a type it may or may not know, must carry an idempotency key.
    fn requires_key(&self, _t: &str) -> bool {
        false
    }
    /// What an accepted event of type `t` asks the writer to keep (see [`Effects`]).
    fn effects(&self, _stream: Stream, _t: &str, _fields: &Map<String, Value>) -> Effects {
        Effects::default()
    }
    /// The field of `t` stored as an artifact when large, if it has one.
    fn spillable(&self, _t: &str, _fields: &Map<String, Value>) -> Option<Spillable> {
        None
    }
    /// Check a stored row's payload as the reads hold it (`verify` reports a refusal); a type it
    /// does not know passes.
    fn check_stored(&self, _stream_id: &str, _t: &str, _fields: &Map<String, Value>) -> Result<()> {
        Ok(())
    }
    /// The types whose stored rows the upgrade of a world rebuilds effects from (see
    /// [`Vocabulary::stored_effects`]).
    fn effect_types(&self) -> &'static [&'static str] {
        &[]
    }
    /// The effects of a stored row of one of [`Vocabulary::effect_types`], as the reads see it:
    /// what an upgrade fills the writer's tables with.
    fn stored_effects(&self, _stream_id: &str, _t: &str, _fields: &Map<String, Value>) -> Effects {
        Effects::default()
    }
    /// How an event of `t` changes the status of `stream_id` in the runs catalog, if this
    /// vocabulary decides it. The event alone decides, never the stream's earlier events.
    fn status_change(&self, _stream_id: &str, _t: &str, _payload: &Map<String, Value>) -> Option<StatusChange> {
        None
    }
    /// Whether [`Vocabulary::status_change`] of a stored `t` reads its payload (the others are
    /// given an empty one, so that a listing does not parse every row).
    fn status_reads_payload(&self, _t: &str) -> bool {
        false
    }
    /// The status of `stream_id` before its first event, if this vocabulary decides it.
    fn initial_status(&self, _stream_id: &str) -> Option<&'static str> {
        None
    }
    /// Refuse `text` (a stream id or an idempotency key, reported as `field`) if it holds what
    /// this vocabulary screens out.
    fn screen(&self, _text: &str, _field: &str) -> Result<()> {
        Ok(())
    }
    /// Whether `text` must not be shown in an error (it looks like a credential).
    fn hides(&self, _text: &str) -> bool {
        false
    }
}

static REGISTERED: OnceLock<Vec<&'static dyn Vocabulary>> = OnceLock::new();

/// Register the process's vocabularies, in the order they are asked. The first registration
/// stands; a later one changes nothing and returns `false`.
pub fn register(vocabularies: Vec<&'static dyn Vocabulary>) -> bool {
    REGISTERED.set(vocabularies).is_ok()
}

/// The registered vocabularies, in order (none before [`register`]).
pub fn registered() -> &'static [&'static dyn Vocabulary] {
    // The kernel's own tests run against a sample vocabulary of their own.
    #[cfg(test)]
    let registered = REGISTERED.get_or_init(|| vec![&testing::Sample]);
    #[cfg(not(test))]
    let registered = REGISTERED.get().map_or(&[][..], Vec::as_slice);
    registered
}

/// The vocabulary that owns `t`: the first that knows it.
pub fn owner(t: &str) -> Option<&'static dyn Vocabulary> {
    registered().iter().copied().find(|v| v.knows(t))
}

/// The vocabulary that takes drafts.
pub fn drafts() -> Option<&'static dyn Vocabulary> {
    registered().iter().copied().find(|v| v.takes_drafts())
}

/// Whether an append of `t` must carry an idempotency key.
pub fn requires_key(t: &str) -> bool {
    registered().iter().any(|v| v.requires_key(t))
}

/// Screen `text` with every vocabulary.
pub fn screen(text: &str, field: &str) -> Result<()> {
    registered().iter().try_for_each(|v| v.screen(text, field))
}

/// Whether any vocabulary hides `text`.
pub fn hides(text: &str) -> bool {
    registered().iter().any(|v| v.hides(text))
}

/// A fold of a world's runs, given to the world when it opens (the priced materializer, with the
/// world's prices): the world takes its snapshots in the background, lists runs with its status
/// and cost, and `verify` checks kept snapshots against it.
pub trait Materializer: Send + Sync {
    /// A snapshot is taken of each run whose sequence reaches a multiple of this.
    fn snapshot_every(&self) -> u64;
    /// Take `run_id`'s snapshot and keep it, if the world keeps snapshots.
    fn take_snapshot(&self, reader: &dyn LogReader, run_id: &str) -> Result<()>;
    /// The key this fold's snapshots are kept under (a change of its prices or its version
    /// changes it).
    fn snapshot_key(&self) -> String;
    /// `run_id`'s state: the fold of its stored rows, as canonical JSON.
    fn state(&self, reader: &dyn LogReader, run_id: &str) -> Result<String>;
    /// A fold of `stream_id`'s rows, given one at a time.
    fn fold<'a>(&'a self, stream_id: &str) -> Box<dyn StreamFold + 'a>;
    /// `stream_id`'s status and its cost in dollars (`null` when unknown), for a listing of runs.
    fn summary(&self, reader: &dyn LogReader, stream_id: &str) -> Result<(Value, Value)>;
}

/// A fold in progress (see [`Materializer::fold`]).
pub trait StreamFold {
    /// Fold the next row, given as its envelope's canonical JSON.
    fn push(&mut self, envelope: &str) -> Result<()>;
    /// The fold's state as a snapshot holds it.
    fn snapshot_text(&self) -> String;
}

/// A vocabulary and a materializer for the kernel's own tests, which exercise each rule the
/// kernel asks a vocabulary for with types of their own:
/// - `sample.started` sets a run `running`, `sample.completed` sets it `completed` and ends it,
///   and a stream `ses_…` starts `open`;
/// - `sample.step` needs a string `stepPath` and moves a pending run to `running`;
/// - `sample.node_ended` needs a string `nodeId`, and ends that node when it is not empty;
/// - `sample.estimate` commits `amount` for `model` (releases it with `released: true`);
/// - every type starting `keyed.` needs an idempotency key; `keyed.usage` adds its `usage`
///   counts to its run's (no more cached input tokens than input tokens), and `keyed.tool`'s
///   large `result` is stored as an artifact;
/// - its ids and keys may not hold `SECRET`, nor may an error show one that does;
/// - it takes drafts.
#[cfg(test)]
pub(crate) mod testing {
    use super::{Effects, Estimate, Materializer, Spillable, Stream, StreamFold, Usage, Vocabulary, USAGE_FIELDS};
    use crate::catalog::StatusChange;
    use crate::error::{Result, WorldError};
    use crate::store::{LogReader, StoredSnapshot};
    use serde_json::{Map, Value};

    pub(crate) struct Sample;

    fn text<'m>(fields: &'m Map<String, Value>, name: &str) -> Result<&'m str> {
        fields
            .get(name)
            .and_then(Value::as_str)
            .ok_or_else(|| WorldError::validation(format!("payload.{name}"), "must be a string"))
    }

    fn tokens(fields: &Map<String, Value>) -> Option<[u64; 4]> {
        let usage = fields.get("usage")?;
        let mut out = [0; 4];
        for (n, name) in out.iter_mut().zip(USAGE_FIELDS) {
            *n = usage.get(name).map_or(Some(0), Value::as_u64)?;
        }
        Some(out)
    }

    impl Vocabulary for Sample {
        fn knows(&self, t: &str) -> bool {
            t.starts_with("sample.") || t.starts_with("keyed.")
        }

        fn check(&self, _stream: Stream, t: &str, fields: &Map<String, Value>) -> Result<()> {
            match t {
                "sample.step" => text(fields, "stepPath").map(drop),
                "sample.node_ended" => text(fields, "nodeId").map(drop),
                "keyed.usage" => match tokens(fields) {
                    Some([input, _, cached, _]) if cached > input => Err(WorldError::validation(
                        "payload.usage.cachedInputTokens",
                        "may not pass inputTokens",
                    )),
                    Some(_) => Ok(()),
                    None => Err(WorldError::validation("payload.usage", "must hold counts")),
                },
                _ => Ok(()),
            }
        }

        fn takes_drafts(&self) -> bool {
            true
        }

        fn screens_ids(&self) -> bool {
            true
        }

        fn requires_key(&self, t: &str) -> bool {
            t.starts_with("keyed.")
        }

        fn effects(&self, _stream: Stream, t: &str, fields: &Map<String, Value>) -> Effects {
            let node = || {
                text(fields, "nodeId")
                    .ok()
                    .filter(|n| !n.is_empty())
                    .map(str::to_string)
            };
            Effects {
                terminal: match t {
                    "sample.completed" => Some(String::new()),
                    "sample.node_ended" => node(),
                    _ => None,
                },
                estimate: (t == "sample.estimate")
                    .then(|| {
                        Some(Estimate {
                            model: text(fields, "model").ok()?.to_string(),
                            field: "amount",
                            amount: fields.get("amount")?.as_u64()?,
                            released: fields.get("released") == Some(&Value::Bool(true)),
                        })
                    })
                    .flatten(),
                usage: (t == "keyed.usage")
                    .then(|| tokens(fields))
                    .flatten()
                    .map(|tokens| Usage {
                        tokens,
                        at: "payload.usage",
                    }),
            }
        }

        fn spillable(&self, t: &str, _fields: &Map<String, Value>) -> Option<Spillable> {
            (t == "keyed.tool").then(|| Spillable {
                field: "result",
                reference: "resultRef",
                step_path: "tool".into(),
            })
        }

        fn check_stored(&self, _stream_id: &str, t: &str, fields: &Map<String, Value>) -> Result<()> {
            self.check(Stream::Run, t, fields)
        }

        fn effect_types(&self) -> &'static [&'static str] {
            &[
                "sample.completed",
                "sample.node_ended",
                "sample.estimate",
                "keyed.usage",
            ]
        }

        fn stored_effects(&self, stream_id: &str, t: &str, fields: &Map<String, Value>) -> Effects {
            match self.check_stored(stream_id, t, fields) {
                Ok(()) => self.effects(Stream::Run, t, fields),
                Err(_) => Effects::default(),
            }
        }

        fn status_change(&self, _stream_id: &str, t: &str, payload: &Map<String, Value>) -> Option<StatusChange> {
            match t {
                "sample.started" => Some(StatusChange::Set("running")),
                "sample.completed" => Some(StatusChange::Set("completed")),
                "sample.step" if payload.get("stepPath").is_some_and(Value::is_string) => Some(StatusChange::Touch),
                _ => None,
            }
        }

        fn status_reads_payload(&self, t: &str) -> bool {
            t == "sample.step"
        }

        fn initial_status(&self, stream_id: &str) -> Option<&'static str> {
            stream_id.starts_with("ses_").then_some("open")
        }

        fn screen(&self, text: &str, field: &str) -> Result<()> {
            if text.contains("SECRET") {
                return Err(WorldError::validation(field, "may not hold a secret"));
            }
            Ok(())
        }

        fn hides(&self, text: &str) -> bool {
            text.contains("SECRET")
        }
    }

    /// A materializer whose fold counts a stream's rows (each must parse as JSON), and keeps a
    /// snapshot every `.0` events.
    pub(crate) struct Counting(pub u64);

    impl StreamFold for u64 {
        fn push(&mut self, envelope: &str) -> Result<()> {
            serde_json::from_str::<Value>(envelope).map_err(|e| WorldError::EventLogCorrupt {
                run_id: None,
                sequence: Some(*self + 1),
                reason: e.to_string(),
            })?;
            *self += 1;
            Ok(())
        }

        fn snapshot_text(&self) -> String {
            self.to_string()
        }
    }

    /// The count of `run_id`'s rows, each parsed.
    fn fold_all(reader: &dyn LogReader, run_id: &str) -> Result<u64> {
        let mut count = 0u64;
        reader.envelopes(run_id, 0, None, &mut |e| count.push(e))?;
        Ok(count)
    }

    impl Materializer for Counting {
        fn snapshot_every(&self) -> u64 {
            self.0
        }

        fn take_snapshot(&self, reader: &dyn LogReader, run_id: &str) -> Result<()> {
            let Some(store) = reader.fold_snapshots() else {
                return Ok(());
            };
            let count = fold_all(reader, run_id)?;
            let snapshot = StoredSnapshot {
                sequence: count,
                state: count.snapshot_text(),
            };
            store.put_snapshot(run_id, &self.snapshot_key(), &snapshot)
        }

        fn snapshot_key(&self) -> String {
            "counting".into()
        }

        fn state(&self, reader: &dyn LogReader, run_id: &str) -> Result<String> {
            let count = fold_all(reader, run_id)?;
            Ok(format!("{{\"events\":{count}}}"))
        }

        fn fold<'a>(&'a self, _stream_id: &str) -> Box<dyn StreamFold + 'a> {
            Box::new(0u64)
        }

        /// The status is the catalog's; reading the stream tells a damaged one.
        fn summary(&self, reader: &dyn LogReader, stream_id: &str) -> Result<(Value, Value)> {
            fold_all(reader, stream_id)?;
            Ok((Value::Null, Value::Null))
        }
    }
}
