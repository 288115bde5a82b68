//! The runs a world holds, with their status and cost, for `listRuns`, `little runs` and the
//! inspector.

use super::World;
use crate::core::error::{Result, WorldError};
use crate::core::materialize::{self, pricing::Pricing};
use crate::core::runtime::{Output, Ticket};
use crate::core::store::LogReader;
use std::sync::Mutex;

/// Each stream's status and cost as last worked out, with the stream's last sequence and event
/// count then. A stream's status is a function of its events alone, which are never changed,
/// only added to, so while both numbers are the same the status is too: a listing of runs folds
/// only the streams that grew since the last one (it folded every stream on every call, and the
/// inspector asks every few seconds). Started over past [`MAX_STATUSES`] streams.
pub(super) type Statuses = Mutex<std::collections::HashMap<String, ((u64, u64), serde_json::Value, serde_json::Value)>>;

/// Most streams whose status a world remembers.
const MAX_STATUSES: usize = 100_000;

impl World {
    /// Every run in the world with its event count, times, status and cost; completes with JSON.
    pub fn runs(&self, ticket: Ticket) -> Result<()> {
        let reader = self.inner.reader.clone();
        let pricing = self.inner.pricing.clone();
        let statuses = self.inner.statuses.clone();
        self.run(ticket, move || {
            let mut out = Vec::new();
            let streams = reader.streams()?;
            // Listed in order of id, each once: anything else is an index that is damaged.
            if let Some(w) = streams.windows(2).find(|w| w[0].run_id >= w[1].run_id) {
                return Err(WorldError::EventLogCorrupt {
                    run_id: Some(w[1].run_id.clone()),
                    sequence: None,
                    reason: "the store lists its runs out of order or one twice: its index is damaged (run `little verify --thorough`)".into(),
                });
            }
            for s in streams {
                let mut row = serde_json::to_value(&s).expect("summary serializes");
                let length = (s.last_sequence, s.event_count);
                let known = statuses
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&s.run_id)
                    .filter(|(at, ..)| *at == length)
                    .map(|(_, status, cost)| (status.clone(), cost.clone()));
                let (status, cost) = match known {
                    Some(known) => known,
                    None => match stream_status(&*reader, &s.run_id, &pricing) {
                        Ok((status, cost)) => {
                            let mut statuses = statuses.lock().unwrap_or_else(|p| p.into_inner());
                            if statuses.len() >= MAX_STATUSES {
                                statuses.clear();
                            }
                            statuses.insert(s.run_id.clone(), (length, status.clone(), cost.clone()));
                            (status, cost)
                        }
                        // A damaged stream is listed as such; `little verify` says what is wrong
                        // with it. (Not remembered: the read may have failed for a passing reason.)
                        Err(_) => (serde_json::json!("unreadable"), serde_json::Value::Null),
                    },
                };
                row["status"] = status;
                row["costUsd"] = cost;
                out.push(row);
            }
            Ok(Output::Json(serde_json::Value::Array(out).to_string()))
        })
    }
}

/// A stream's status and cost in dollars: from the run-event fold for a run-event stream (a
/// session is `open` until `session:cancelled`), else from the materializer.
fn stream_status(
    reader: &dyn LogReader,
    id: &str,
    pricing: &Pricing,
) -> Result<(serde_json::Value, serde_json::Value)> {
    use crate::core::run_events::{self, stored};
    // Both texts are this build's own JSON, around payloads of up to 1,000 levels.
    let parse = |text: String, around: usize| {
        crate::core::canonical::parse_around(&text, around).map_err(|e| WorldError::RuntimeIntegrity {
            reason: format!("internal error: {id}'s own JSON {e}"),
        })
    };
    let log = parse(stored::read_log(reader, id, false)?, 1)?;
    let events = log.as_array().map(Vec::as_slice).unwrap_or_default();
    if events.is_empty() {
        let state = parse(materialize::fold_stored(reader, id, pricing)?, 3)?;
        return Ok((state["status"].clone(), state["usage"]["costUsd"].clone()));
    }
    if stored::stream_of(id) == run_events::Stream::Session {
        let cancelled = events.iter().any(|e| e["type"] == "session:cancelled");
        return Ok((
            serde_json::json!(if cancelled { "cancelled" } else { "open" }),
            serde_json::Value::Null,
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
