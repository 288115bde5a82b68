//! The runs catalog: one row per stream (run or session), kept by every backend in the same
//! transaction as the stream's events, so that a listing of runs reads a page of rows rather than
//! every event ever recorded.
//!
//! A row holds the stream's last sequence (its event count: sequences are dense from 1), the
//! `recordedAt` of its first and last events, and its status. The status is worked out at commit
//! from each event alone, as a change to the status before it ([`StatusChange`]), by the first
//! registered vocabulary that decides it ([`crate::vocabulary::Vocabulary::status_change`]):
//! the run events follow their fold, the event log's own types the materializer, the Workflow
//! SDK's run events their own status. A stream starts `pending` unless a vocabulary says
//! otherwise (a session starts `open`). Each event decides by its own type, so a stream that
//! mixes vocabularies takes each event's change in turn.
//!
//! A backend stages one [`CatalogNote`] per inserted row ([`CatalogStage`]) and writes one row
//! per stream at commit; pages are read by [`RunQuery`], a status at a time, and merged here.

use crate::error::{Result, WorldError};
use crate::vocabulary;
use serde_json::{Map, Value};

/// How one event changes its stream's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusChange {
    /// The status stays as it was.
    Keep,
    /// A `pending` stream becomes `running`; any other stays as it was.
    Touch,
    /// The status becomes this.
    Set(&'static str),
}

impl StatusChange {
    /// This change, then `next`.
    pub fn then(self, next: StatusChange) -> StatusChange {
        match (self, next) {
            (_, StatusChange::Set(s)) => StatusChange::Set(s),
            (a, StatusChange::Keep) => a,
            (StatusChange::Set(s), StatusChange::Touch) => StatusChange::Set(touched(s)),
            (_, StatusChange::Touch) => StatusChange::Touch,
        }
    }

    /// The status after this change of `status`.
    pub fn apply(self, status: &str) -> &str {
        match self {
            StatusChange::Keep => status,
            StatusChange::Touch => touched(status),
            StatusChange::Set(s) => s,
        }
    }

    /// What the change sets, if it sets a status; and whether it touches.
    pub fn parts(self) -> (Option<&'static str>, bool) {
        match self {
            StatusChange::Keep => (None, false),
            StatusChange::Touch => (None, true),
            StatusChange::Set(s) => (Some(s), false),
        }
    }
}

fn touched(status: &str) -> &str {
    if status == "pending" {
        "running"
    } else {
        status
    }
}

/// The status of a stream before its first event: the first registered vocabulary's that
/// decides it, else `pending`.
pub fn initial_status(stream_id: &str) -> &'static str {
    vocabulary::registered()
        .iter()
        .find_map(|v| v.initial_status(stream_id))
        .unwrap_or("pending")
}

/// The statuses in which a stream has ended: nothing more will happen to it.
pub const TERMINAL_STATUSES: &[&str] = &["completed", "failed", "cancelled", "timed_out"];

/// Whether a stream's status says it has ended.
pub fn is_terminal(status: &str) -> bool {
    TERMINAL_STATUSES.contains(&status)
}

/// How an event of `event_type` with `payload`, appended to `stream_id`, changes its status: by
/// the first registered vocabulary that decides it, else not at all. The event alone decides,
/// never the stream's earlier events, so that the change is known before the stream is read.
pub fn status_change(stream_id: &str, event_type: &str, payload: &Map<String, Value>) -> StatusChange {
    vocabulary::registered()
        .iter()
        .find_map(|v| v.status_change(stream_id, event_type, payload))
        .unwrap_or(StatusChange::Keep)
}

/// [`status_change`] of a stored row, `envelope` its canonical JSON: the payload is parsed only
/// for the types whose change depends on it (a vocabulary says which). What the upgrades and
/// `little verify` work a stream's status out with.
pub fn stored_status_change(stream_id: &str, event_type: &str, envelope: &str) -> StatusChange {
    let reads_payload = vocabulary::registered()
        .iter()
        .any(|v| v.status_reads_payload(event_type));
    let payload = match crate::canonical::parse_around(envelope, 1) {
        _ if !reads_payload => Map::new(),
        Ok(Value::Object(mut e)) => match e.remove("payload") {
            Some(Value::Object(p)) => p,
            _ => Map::new(),
        },
        _ => Map::new(),
    };
    status_change(stream_id, event_type, &payload)
}

/// One inserted row's part in its stream's catalog row.
#[derive(Debug, Clone)]
pub struct CatalogNote {
    pub run_id: String,
    pub sequence: u64,
    pub recorded_at: String,
    pub status: StatusChange,
}

/// A stream's catalog row as a transaction leaves it: its last sequence, the time of its first
/// event when the transaction wrote it (sequence 1), the time of its last, and the change of its
/// status over the transaction's events (a `Set` when the transaction wrote its first event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogWrite {
    pub run_id: String,
    pub last_sequence: u64,
    pub first_recorded_at: Option<String>,
    pub last_recorded_at: String,
    pub status: StatusChange,
}

/// The notes a transaction has staged, in order; a savepoint is a length to truncate back to.
#[derive(Debug, Default)]
pub struct CatalogStage {
    notes: Vec<CatalogNote>,
}

impl CatalogStage {
    pub fn note(&mut self, note: CatalogNote) {
        self.notes.push(note);
    }

    pub fn len(&self) -> usize {
        self.notes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.notes.is_empty()
    }

    pub fn truncate(&mut self, len: usize) {
        self.notes.truncate(len);
    }

    pub fn clear(&mut self) {
        self.notes.clear();
    }

    /// One write per stream, ordered by stream id (the order in which rows are locked).
    pub fn writes(&self) -> Vec<CatalogWrite> {
        let mut by_run: std::collections::BTreeMap<&str, CatalogWrite> = std::collections::BTreeMap::new();
        for n in &self.notes {
            let first = n.sequence == 1;
            let status = if first {
                StatusChange::Set(n.status.apply(initial_status(&n.run_id)))
            } else {
                n.status
            };
            match by_run.get_mut(n.run_id.as_str()) {
                Some(w) => {
                    w.last_sequence = n.sequence;
                    w.last_recorded_at.clone_from(&n.recorded_at);
                    w.status = if first { status } else { w.status.then(status) };
                    if first {
                        w.first_recorded_at = Some(n.recorded_at.clone());
                    }
                }
                None => {
                    by_run.insert(
                        &n.run_id,
                        CatalogWrite {
                            run_id: n.run_id.clone(),
                            last_sequence: n.sequence,
                            first_recorded_at: first.then(|| n.recorded_at.clone()),
                            last_recorded_at: n.recorded_at.clone(),
                            status,
                        },
                    );
                }
            }
        }
        by_run.into_values().collect()
    }
}

/// A stream's catalog row as stored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CatalogRow {
    pub run_id: String,
    pub last_sequence: u64,
    pub first_recorded_at: String,
    pub last_recorded_at: String,
    pub status: String,
}

/// The order of a page of runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunOrder {
    /// By last `recordedAt`, latest first, then by id, descending.
    Newest,
    /// By last `recordedAt`, earliest first, then by id.
    Oldest,
    /// By id.
    Id,
}

impl RunOrder {
    fn name(self) -> &'static str {
        match self {
            RunOrder::Newest => "newest",
            RunOrder::Oldest => "oldest",
            RunOrder::Id => "id",
        }
    }

    /// The sort key of a row in this order, ascending.
    pub fn sort_key(self, r: &CatalogRow) -> (String, String) {
        match self {
            RunOrder::Newest | RunOrder::Oldest => (r.last_recorded_at.clone(), r.run_id.clone()),
            RunOrder::Id => (String::new(), r.run_id.clone()),
        }
    }
}

/// Where a page starts: after the row with this sort key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct After {
    pub last_recorded_at: String,
    pub run_id: String,
}

/// One backend read of the catalog: rows of one status (or any), within the bounds, after the
/// cursor, in `order`, at most `limit`.
#[derive(Debug, Clone)]
pub struct RunQuery<'a> {
    pub status: Option<&'a str>,
    /// Last `recordedAt` before this (exclusive).
    pub before: Option<&'a str>,
    /// Last `recordedAt` at or after this.
    pub after_time: Option<&'a str>,
    pub order: RunOrder,
    pub after: Option<&'a After>,
    pub limit: u64,
}

impl RunQuery<'_> {
    /// Whether `row` is one this query wants (for a backend that filters rows itself).
    pub fn wants(&self, row: &CatalogRow) -> bool {
        let at = row.last_recorded_at.as_str();
        self.status.is_none_or(|s| s == row.status)
            && self.before.is_none_or(|b| at < b)
            && self.after_time.is_none_or(|a| at >= a)
            && self.after.is_none_or(|c| match self.order {
                RunOrder::Newest => (at, row.run_id.as_str()) < (c.last_recorded_at.as_str(), c.run_id.as_str()),
                RunOrder::Oldest => (at, row.run_id.as_str()) > (c.last_recorded_at.as_str(), c.run_id.as_str()),
                RunOrder::Id => row.run_id.as_str() > c.run_id.as_str(),
            })
    }
}

/// Sort `rows` into `order`.
pub fn sort(rows: &mut [CatalogRow], order: RunOrder) {
    rows.sort_by(|a, b| {
        let (ka, kb) = (order.sort_key(a), order.sort_key(b));
        if order == RunOrder::Newest {
            kb.cmp(&ka)
        } else {
            ka.cmp(&kb)
        }
    });
}

/// A page request as the caller gives it (JSON from the binding).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PageRequest {
    pub status: Option<Vec<String>>,
    pub last_recorded_before: Option<String>,
    pub last_recorded_after: Option<String>,
    pub order: Option<String>,
    pub limit: Option<u64>,
    pub cursor: Option<String>,
}

/// Most runs a page may hold.
pub const MAX_PAGE: u64 = 10_000;
/// Runs a page holds when the caller does not say.
pub const DEFAULT_PAGE: u64 = 100;

/// A checked page request.
#[derive(Debug, Clone)]
pub struct Page {
    pub statuses: Option<Vec<String>>,
    pub before: Option<String>,
    pub after_time: Option<String>,
    pub order: RunOrder,
    pub limit: u64,
    pub after: Option<After>,
}

fn invalid(field: &str, why: impl Into<String>) -> WorldError {
    WorldError::validation(field, why.into())
}

/// A time bound as the catalog compares it: a `recordedAt` string (`YYYY-MM-DDTHH:MM:SS.mmmZ`).
pub fn check_time(field: &str, t: &str) -> Result<String> {
    let ok = t.len() == 24
        && t.bytes().enumerate().all(|(i, b)| match i {
            4 | 7 => b == b'-',
            10 => b == b'T',
            13 | 16 => b == b':',
            19 => b == b'.',
            23 => b == b'Z',
            _ => b.is_ascii_digit(),
        });
    if ok {
        Ok(t.to_string())
    } else {
        Err(invalid(field, "must be an ISO time such as 2026-01-31T12:00:00.000Z"))
    }
}

/// The page of the runs that ended before `ended_before` (an ISO time) in one of `statuses` (each
/// one in which a run has ended; all of them by default), in `order`, `limit` at a time: the runs a
/// prune deletes, or an export of ended runs writes. `field` is the statuses option's name.
pub fn ended_page(
    ended_before: String,
    statuses: Option<Vec<String>>,
    field: &str,
    order: &str,
    limit: u64,
) -> Result<Page> {
    let statuses = statuses.unwrap_or_else(|| TERMINAL_STATUSES.iter().map(|s| s.to_string()).collect());
    if let Some(s) = statuses.iter().find(|s| !is_terminal(s)) {
        return Err(invalid(
            field,
            format!(
                "may name only statuses in which a run has ended ({}), not {s:?}",
                TERMINAL_STATUSES.join(", ")
            ),
        ));
    }
    // The page machinery checks the time and the statuses as a query of the catalog would.
    Page::from_request(PageRequest {
        status: Some(statuses),
        last_recorded_before: Some(ended_before),
        order: Some(order.into()),
        limit: Some(limit),
        ..PageRequest::default()
    })
    .map_err(|e| match e {
        WorldError::Validation { path, .. } if path == "lastRecordedBefore" => {
            invalid("endedBefore", "must be an ISO time such as 2026-01-31T12:00:00.000Z")
        }
        other => other,
    })
}

impl Page {
    /// Check a caller's request.
    pub fn from_request(req: PageRequest) -> Result<Page> {
        let order = match req.order.as_deref() {
            None | Some("newest") => RunOrder::Newest,
            Some("oldest") => RunOrder::Oldest,
            Some("id") => RunOrder::Id,
            Some(_) => return Err(invalid("order", "must be 'newest', 'oldest' or 'id'")),
        };
        let limit = req.limit.unwrap_or(DEFAULT_PAGE);
        if limit == 0 || limit > MAX_PAGE {
            return Err(invalid("limit", format!("must be an integer from 1 to {MAX_PAGE}")));
        }
        if let Some(statuses) = &req.status {
            if statuses.is_empty() || statuses.iter().any(|s| s.is_empty() || s.len() > 64) {
                return Err(invalid("status", "must be a non-empty array of status names"));
            }
        }
        let before = req
            .last_recorded_before
            .as_deref()
            .map(|t| check_time("lastRecordedBefore", t))
            .transpose()?;
        let after_time = req
            .last_recorded_after
            .as_deref()
            .map(|t| check_time("lastRecordedAfter", t))
            .transpose()?;
        let after = req.cursor.as_deref().map(|c| decode_cursor(c, order)).transpose()?;
        let mut statuses = req.status;
        if let Some(s) = &mut statuses {
            s.sort();
            s.dedup();
        }
        Ok(Page {
            statuses,
            before,
            after_time,
            order,
            limit,
            after,
        })
    }

    /// Start the next read after the last of `rows`, the page just read (none: no change).
    pub fn advance(&mut self, rows: &[CatalogRow]) {
        if let Some(r) = rows.last() {
            self.after = Some(After {
                last_recorded_at: r.last_recorded_at.clone(),
                run_id: r.run_id.clone(),
            });
        }
    }

    /// The backend reads this page takes: one per status asked for, or one for any status.
    pub fn queries<'p>(&'p self) -> Vec<RunQuery<'p>> {
        let one = |status: Option<&'p str>| RunQuery {
            status,
            before: self.before.as_deref(),
            after_time: self.after_time.as_deref(),
            order: self.order,
            after: self.after.as_ref(),
            // One more than the page, to know whether another page follows.
            limit: self.limit + 1,
        };
        match &self.statuses {
            None => vec![one(None)],
            Some(s) => s.iter().map(|s| one(Some(s))).collect(),
        }
    }

    /// The page from the backend reads' rows: merged into order, cut to the limit, with the cursor
    /// of the next page when there is one.
    pub fn finish(&self, mut rows: Vec<CatalogRow>) -> (Vec<CatalogRow>, Option<String>) {
        sort(&mut rows, self.order);
        let more = rows.len() as u64 > self.limit;
        rows.truncate(self.limit as usize);
        let cursor = more.then(|| encode_cursor(rows.last().expect("a full page has a last row"), self.order));
        (rows, cursor)
    }
}

/// A cursor: the order's name and the last row's sort key, as URL-safe text.
fn encode_cursor(row: &CatalogRow, order: RunOrder) -> String {
    let text = serde_json::json!([order.name(), row.last_recorded_at, row.run_id]).to_string();
    hex::encode(text.as_bytes())
}

fn decode_cursor(cursor: &str, order: RunOrder) -> Result<After> {
    let bad = || {
        invalid(
            "cursor",
            "is not a cursor this world gave, or was given for another order",
        )
    };
    if cursor.len() > 4096 {
        return Err(bad());
    }
    let bytes = hex::decode(cursor).map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    match v.as_array().map(Vec::as_slice) {
        Some([Value::String(o), Value::String(at), Value::String(id)]) if o == order.name() => Ok(After {
            last_recorded_at: at.clone(),
            run_id: id.clone(),
        }),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(run: &str, sequence: u64, at: &str, status: StatusChange) -> CatalogNote {
        CatalogNote {
            run_id: run.into(),
            sequence,
            recorded_at: at.into(),
            status,
        }
    }

    #[test]
    fn a_transaction_writes_one_row_per_stream_with_its_changes_composed() {
        let mut stage = CatalogStage::default();
        stage.note(note("run_b", 4, "t1", StatusChange::Touch));
        stage.note(note("run_a", 1, "t1", StatusChange::Keep));
        stage.note(note("run_a", 2, "t2", StatusChange::Touch));
        stage.note(note("run_b", 5, "t2", StatusChange::Set("completed")));
        stage.note(note("ses_x", 1, "t3", StatusChange::Keep));
        let writes = stage.writes();
        assert_eq!(writes.len(), 3);
        assert_eq!(writes[0].run_id, "run_a");
        assert_eq!(writes[0].status, StatusChange::Set("running"));
        assert_eq!(writes[0].first_recorded_at.as_deref(), Some("t1"));
        assert_eq!(writes[0].last_sequence, 2);
        assert_eq!(writes[1].status, StatusChange::Set("completed"));
        assert_eq!(writes[1].first_recorded_at, None);
        assert_eq!(writes[2].status, StatusChange::Set("open"));
        stage.truncate(1);
        assert_eq!(stage.writes()[0].status, StatusChange::Touch);
    }

    #[test]
    fn a_cursor_is_for_its_order_only() {
        let row = CatalogRow {
            run_id: "run_a".into(),
            last_sequence: 1,
            first_recorded_at: "2026-01-01T00:00:00.000Z".into(),
            last_recorded_at: "2026-01-01T00:00:00.000Z".into(),
            status: "pending".into(),
        };
        let c = encode_cursor(&row, RunOrder::Newest);
        assert_eq!(decode_cursor(&c, RunOrder::Newest).unwrap().run_id, "run_a");
        assert_eq!(decode_cursor(&c, RunOrder::Id).unwrap_err().code(), "EVENT_VALIDATION");
        assert_eq!(
            decode_cursor("zz", RunOrder::Id).unwrap_err().code(),
            "EVENT_VALIDATION"
        );
    }
}
