//! The priced materializer as the kernel's [`Materializer`]: snapshots every
//! [`snapshot::SNAPSHOT_EVERY`] events under the key of its prices, and a listing's status and
//! cost of a stream from the run-event fold (for a run-event stream) or from this fold.

use super::pricing::Pricing;
use super::{fold_stored, snapshot, Fold};
use crate::run_events::{self, stored, Stream};
use little_world_kernel::error::{Result, WorldError};
use little_world_kernel::store::LogReader;
use little_world_kernel::vocabulary::{Materializer, StreamFold};
use serde_json::Value;

/// The materializer with a world's prices.
pub struct Priced(pub Pricing);

impl StreamFold for Fold<'_> {
    fn push(&mut self, envelope: &str) -> Result<()> {
        Fold::push(self, envelope)
    }

    fn snapshot_text(&self) -> String {
        Fold::snapshot_text(self)
    }
}

impl Materializer for Priced {
    fn snapshot_every(&self) -> u64 {
        snapshot::SNAPSHOT_EVERY
    }

    fn take_snapshot(&self, reader: &dyn LogReader, run_id: &str) -> Result<()> {
        snapshot::take(reader, run_id, &self.0)
    }

    fn snapshot_key(&self) -> String {
        snapshot::key(&self.0)
    }

    fn state(&self, reader: &dyn LogReader, run_id: &str) -> Result<String> {
        fold_stored(reader, run_id, &self.0)
    }

    fn fold<'a>(&'a self, stream_id: &str) -> Box<dyn StreamFold + 'a> {
        Box::new(Fold::new(stream_id, &self.0))
    }

    /// From the run-event fold for a run-event stream (a session is `open` until
    /// `session:cancelled`), else from the materializer.
    fn summary(&self, reader: &dyn LogReader, id: &str) -> Result<(Value, Value)> {
        // Both texts are this build's own JSON, around payloads of up to 1,000 levels.
        let parse = |text: String, around: usize| {
            little_world_kernel::canonical::parse_around(&text, around).map_err(|e| WorldError::RuntimeIntegrity {
                reason: format!("internal error: {id}'s own JSON {e}"),
            })
        };
        let log = parse(stored::read_log(reader, id, false)?, 1)?;
        let events = log.as_array().map(Vec::as_slice).unwrap_or_default();
        if events.is_empty() {
            let state = parse(fold_stored(reader, id, &self.0)?, 3)?;
            return Ok((state["status"].clone(), state["usage"]["costUsd"].clone()));
        }
        if stored::stream_of(id) == Stream::Session {
            let cancelled = events.iter().any(|e| e["type"] == "session:cancelled");
            return Ok((
                serde_json::json!(if cancelled { "cancelled" } else { "open" }),
                Value::Null,
            ));
        }
        let state = run_events::fold(events)?;
        // Micro-cents are 1e-6 cents: 1e-8 dollars.
        let realized = state["costs"]["realizedCostMicrocents"].as_u64().unwrap_or(0);
        let usd = format!("{}.{:08}", realized / 100_000_000, realized % 100_000_000)
            .parse::<f64>()
            .unwrap_or(0.0);
        Ok((state["status"].clone(), serde_json::json!(usd)))
    }
}
