//! What the append rules ask of a vocabulary of event types.
//!
//! A world stores two vocabularies in one log: the event log's own types (`RunStarted`,
//! `harness.model.responded`, ...; see [`crate::core::log_types`]) and the run events of a
//! sister engine, on runs and on sessions (`node:completed`, `session:turn_started`, ...; see
//! [`crate::core::run_events`]). Each is a module that implements [`Vocabulary`]; the append
//! rules ([`crate::core::events`]) call them through it, and neither imports anything back.

use crate::core::error::Result;
use serde_json::{Map, Value};

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
    /// Its token counts (`[input, output, cached input, reasoning]`), added to its run's: no total
    /// may pass 2^53 - 1.
    pub usage: Option<[u64; 4]>,
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

/// A vocabulary of event types.
pub trait Vocabulary: Sync {
    /// Whether `t` is one of its types, on some stream.
    fn knows(&self, t: &str) -> bool;
    /// Check the fields of an event of type `t` (one it knows) appended to `stream`. Errors name
    /// the fields from the vocabulary's own root (`payload.` for the event log's types, `event.`
    /// for run events).
    fn check(&self, stream: Stream, t: &str, fields: &Map<String, Value>) -> Result<()>;
    /// What an accepted event of type `t` asks the writer to keep (see [`Effects`]).
    fn effects(&self, stream: Stream, t: &str, fields: &Map<String, Value>) -> Effects;
    /// The field of `t` stored as an artifact when large, if it has one.
    fn spillable(&self, t: &str, fields: &Map<String, Value>) -> Option<Spillable>;
}
