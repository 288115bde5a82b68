//! The runs a world holds, with their status and cost, for `listRuns`, `queryRuns`, `little runs`
//! and the inspector: read from the runs catalog, and folded for their cost.

use super::World;
use crate::catalog::{CatalogRow, Page, PageRequest, RunOrder, RunQuery};
use crate::error::{Result, WorldError};
use crate::runtime::{Output, Ticket};
use crate::store::LogReader;
use crate::vocabulary::Materializer;
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
    /// Every run in the world with its event count, times, status and cost, ordered by id;
    /// completes with JSON. Reads the runs catalog, and folds the streams that grew since the last
    /// listing for their cost.
    pub fn runs(&self, ticket: Ticket) -> Result<()> {
        let reader = self.inner.reader.clone();
        let materializer = self.inner.materializer.clone();
        let statuses = self.inner.statuses.clone();
        self.run(ticket, move || {
            let all = RunQuery {
                status: None,
                before: None,
                after_time: None,
                order: RunOrder::Id,
                after: None,
                limit: u64::MAX >> 1,
            };
            let rows = reader.catalog_page(&all)?;
            // Listed in order of id, each once: anything else is an index that is damaged.
            if let Some(w) = rows.windows(2).find(|w| w[0].run_id >= w[1].run_id) {
                return Err(WorldError::EventLogCorrupt {
                    run_id: Some(w[1].run_id.clone()),
                    sequence: None,
                    reason: "the store lists its runs out of order or one twice: its index is damaged (run `little verify --thorough`)".into(),
                });
            }
            let out: Vec<_> = rows.into_iter().map(|r| summary(&*reader, &*materializer, &statuses, r)).collect();
            Ok(Output::Json(serde_json::Value::Array(out).to_string()))
        })
    }

    /// A page of the runs catalog (see [`crate::catalog::Page`]), `request` its options as
    /// JSON; completes with `{ runs, cursor }`. Only the page's runs are folded for their cost.
    pub fn query_runs(&self, ticket: Ticket, request: &str) -> Result<()> {
        let request: PageRequest = serde_json::from_str(request)
            .map_err(|e| WorldError::validation("queryRuns options", format!("are not valid: {e}")))?;
        let page = Page::from_request(request)?;
        let reader = self.inner.reader.clone();
        let materializer = self.inner.materializer.clone();
        let statuses = self.inner.statuses.clone();
        self.run(ticket, move || {
            let (rows, cursor) = read_page(&*reader, &page)?;
            let runs: Vec<_> = rows
                .into_iter()
                .map(|r| summary(&*reader, &*materializer, &statuses, r))
                .collect();
            Ok(Output::Json(
                serde_json::json!({ "runs": runs, "cursor": cursor }).to_string(),
            ))
        })
    }
}

/// `page` of the runs catalog: its rows in its order, cut to its limit, and the cursor of the page
/// after it when there is one.
pub(super) fn read_page(reader: &dyn LogReader, page: &Page) -> Result<(Vec<CatalogRow>, Option<String>)> {
    let mut rows = Vec::new();
    for q in page.queries() {
        rows.extend(reader.catalog_page(&q)?);
    }
    Ok(page.finish(rows))
}

/// A catalog row as `listRuns` and `queryRuns` give it: with its event count and its cost, and
/// `unreadable` for the status of a stream whose events do not fold.
fn summary(
    reader: &dyn LogReader,
    materializer: &dyn Materializer,
    statuses: &Statuses,
    r: CatalogRow,
) -> serde_json::Value {
    let length = (r.last_sequence, r.last_sequence);
    let known = statuses
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&r.run_id)
        .filter(|(at, ..)| *at == length)
        .map(|(_, status, cost)| (status.clone(), cost.clone()));
    let (status, cost) = match known {
        Some(known) => known,
        None => match materializer.summary(reader, &r.run_id) {
            Ok((_, cost)) => {
                let status = serde_json::json!(r.status);
                let mut statuses = statuses.lock().unwrap_or_else(|p| p.into_inner());
                if statuses.len() >= MAX_STATUSES {
                    statuses.clear();
                }
                statuses.insert(r.run_id.clone(), (length, status.clone(), cost.clone()));
                (status, cost)
            }
            // A damaged stream is listed as such; `little verify` says what is wrong with it.
            // (Not remembered: the read may have failed for a passing reason.)
            Err(_) => (serde_json::json!("unreadable"), serde_json::Value::Null),
        },
    };
    serde_json::json!({
        "runId": r.run_id,
        "eventCount": r.last_sequence,
        "lastSequence": r.last_sequence,
        "firstRecordedAt": r.first_recorded_at,
        "lastRecordedAt": r.last_recorded_at,
        "status": status,
        "costUsd": cost,
    })
}
