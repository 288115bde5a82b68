//! Listing envelopes for JavaScript without one big JSON parse.
//!
//! `JSON.parse` of a whole log (tens of megabytes) and deep-freezing every payload is most of the
//! cost of a listing, and most callers read few payloads. So a listing crosses N-API as one string
//! holding, row after row, the event id, `recordedAt`, type, idempotency key, request digest and
//! the payload's canonical JSON, plus a table of numbers saying where each piece starts; `world.ts`
//! cuts the pieces out (V8 makes those slices without copying) and decodes a payload only when it
//! is first read.

use super::EnvelopeFields;
use crate::error::{Result, WorldError};
use crate::store::{Dense, LogReader, RowRef};

/// Numbers per row in the table: the sequence, six piece starts, and the row's end.
pub const STRIDE: usize = 8;

/// A packed listing: the concatenated pieces, and per row `[sequence, eventId, recordedAt, type,
/// key, digest, payload, end]` as offsets in UTF-16 code units (JavaScript string indices).
pub struct Packed {
    pub text: String,
    pub table: Vec<f64>,
}

fn utf16_len(s: &str) -> usize {
    if s.is_ascii() {
        s.len()
    } else {
        s.encode_utf16().count()
    }
}

/// The payload's text inside a stored canonical envelope. A canonical envelope is exactly
/// `{[key,][digest,]"eventId":…,"payload":<payload>,"recordedAt":…,"runId":…,"sequence":…,"type":…}`,
/// so the text around the payload is rebuilt from the row's columns (into `scratch`) and checked
/// byte for byte; no searching. `None` when the stored text is not that envelope.
fn payload_slice<'a>(row: &RowRef<'a>, scratch: &mut Vec<u8>) -> Option<&'a str> {
    let fields = EnvelopeFields {
        event_id: row.event_id,
        run_id: row.run_id,
        sequence: row.sequence,
        event_type: row.event_type,
        key: row.key,
        digest: row.digest,
        recorded_at: row.recorded_at,
    };
    scratch.clear();
    fields.write_head(scratch);
    let head = scratch.len();
    fields.write_tail(scratch);
    let tail = scratch.len() - head;
    let env = row.envelope.as_bytes();
    let ok = env.len() > head + tail && env[..head] == scratch[..head] && env[env.len() - tail..] == scratch[head..];
    // The boundaries fall on ASCII bytes, so the slice is on char boundaries.
    ok.then(|| &row.envelope[head..env.len() - tail])
}

/// Longest text of one part, in UTF-16 code units: V8's strings hold at most 2^29 - 24, and a
/// listing that would not fit one string is handed over in several parts.
const PART_MAX: usize = 1 << 28;

/// The envelopes of `run_id` after `after` (at most `limit`), packed into parts of at most
/// [`PART_MAX`] code units of text each (one part unless the listing is very large).
pub fn list_packed(reader: &dyn LogReader, run_id: &str, after: u64, limit: Option<u64>) -> Result<Vec<Packed>> {
    list_packed_in_parts(reader, run_id, after, limit, PART_MAX)
}

fn list_packed_in_parts(
    reader: &dyn LogReader,
    run_id: &str,
    after: u64,
    limit: Option<u64>,
    part_max: usize,
) -> Result<Vec<Packed>> {
    let mut packer = Packer::new(limit, part_max);
    let mut dense = Dense::after(run_id, after);
    reader.rows(run_id, after, limit, &mut |row| {
        dense.check(row.sequence)?;
        packer.push(&row)
    })?;
    Ok(packer.finish())
}

/// [`list_packed`] of about `max_units` UTF-16 code units of text (the length of the parts' text
/// in JavaScript): whole rows, at least one, ending with the first row that reaches it, so a
/// listing with at least `max_units` of text may have more rows after it. Read one row first,
/// then in chunks of as many rows as would fill the rest of the budget at the rows' average size
/// so far (and one more), but at most 8 times the rows read so far: a page of small rows takes 4
/// queries, and rows past the budget, which SQLite reads whole though they are left for the next
/// page, are at most 8 times those kept however sizes vary (a small row and then large ones read
/// 255 rows to keep 5). By count alone, a live tail of a run of large events held a whole page.
pub fn list_packed_within(
    reader: &dyn LogReader,
    run_id: &str,
    after: u64,
    limit: Option<u64>,
    max_units: usize,
) -> Result<Vec<Packed>> {
    let mut packer = Packer::new(Some(limit.unwrap_or(64).min(64)), PART_MAX);
    let mut dense = Dense::after(run_id, after);
    let (mut after, mut left, mut chunk, mut rows) = (after, limit, 1u64, 0u64);
    loop {
        let take = left.map_or(chunk, |l| l.min(chunk));
        let mut read = 0;
        reader.rows(run_id, after, Some(take), &mut |row| {
            if packer.units >= max_units {
                return Ok(()); // the rest of a chunk past the budget is left for the next page
            }
            dense.check(row.sequence)?;
            after = row.sequence;
            read += 1;
            packer.push(&row)
        })?;
        left = left.map(|l| l - read);
        if read < take || packer.units >= max_units || left == Some(0) {
            return Ok(packer.finish());
        }
        rows += read;
        let average = (packer.units as u64 / rows).max(1);
        chunk = ((max_units - packer.units) as u64 / average + 1).min(rows.saturating_mul(8));
    }
}

/// Packs rows into parts of at most `part_max` code units of text each.
struct Packer {
    parts: Vec<Packed>,
    text: String,
    table: Vec<f64>,
    /// Where the next piece starts in this part's text, in UTF-16 code units.
    at: usize,
    /// The text of all parts, in UTF-16 code units.
    units: usize,
    scratch: Vec<u8>,
    part_max: usize,
}

impl Packer {
    fn new(limit: Option<u64>, part_max: usize) -> Packer {
        // Room for a typical row, so the text is not copied as it grows.
        let expected = limit.unwrap_or(1024).min(1 << 20) as usize;
        Packer {
            parts: Vec::new(),
            text: String::with_capacity(expected * 320),
            table: Vec::with_capacity(expected * STRIDE),
            at: 0,
            units: 0,
            scratch: Vec::with_capacity(256),
            part_max,
        }
    }

    fn push(&mut self, row: &RowRef<'_>) -> Result<()> {
        let payload = payload_slice(row, &mut self.scratch).ok_or_else(|| WorldError::EventLogCorrupt {
            run_id: Some(row.run_id.to_string()),
            sequence: Some(row.sequence),
            reason: "the stored envelope is not in canonical form".into(),
        })?;
        let pieces = [
            row.event_id,
            row.recorded_at,
            row.event_type,
            row.key.unwrap_or(""),
            row.digest.unwrap_or(""),
            payload,
        ];
        let lens = pieces.map(utf16_len);
        let units = lens.iter().sum::<usize>();
        if self.at > 0 && self.at + units > self.part_max {
            self.parts.push(Packed {
                text: std::mem::take(&mut self.text),
                table: std::mem::take(&mut self.table),
            });
            self.at = 0;
        }
        self.table.push(row.sequence as f64);
        for (piece, len) in pieces.into_iter().zip(lens) {
            self.table.push(self.at as f64);
            self.text.push_str(piece);
            self.at += len;
        }
        self.table.push(self.at as f64);
        self.units += units;
        Ok(())
    }

    fn finish(mut self) -> Vec<Packed> {
        self.parts.push(Packed {
            text: self.text,
            table: self.table,
        });
        self.parts
    }
}

/// Rows per part above which a listing is read by two threads at once.
const SPLIT_AT: u64 = 20_000;

/// [`list_packed`], read in two halves on two threads when the listing is large (the JavaScript
/// thread is only waiting meanwhile, so both cores can read). Parts are in sequence order.
pub fn list_packed_parallel(
    reader: &dyn LogReader,
    run_id: &str,
    after: u64,
    limit: Option<u64>,
) -> Result<Vec<Packed>> {
    let last = reader.last_sequence(run_id)?;
    let end = limit.map_or(last, |l| last.min(after.saturating_add(l)));
    let count = end.saturating_sub(after);
    // Rows are only ever added, so a listing of fewer rows than the run's last sequence says
    // there are is one whose rows the store could not all find.
    let whole = |parts: Vec<Packed>| -> Result<Vec<Packed>> {
        let rows: usize = parts.iter().map(|p| p.table.len() / STRIDE).sum();
        if (rows as u64) < count {
            return Err(WorldError::EventLogCorrupt {
                run_id: Some(run_id.to_string()),
                sequence: Some(after + rows as u64 + 1),
                reason: format!(
                    "the run's last sequence is {last}, and the store found no row {} (run `little verify --thorough`)",
                    after + rows as u64 + 1
                ),
            });
        }
        Ok(parts)
    };
    if count < 2 * SPLIT_AT {
        return whole(list_packed(reader, run_id, after, limit)?);
    }
    let mid = after + count / 2;
    let halves = std::thread::scope(|scope| {
        // At the process's thread limit, this thread reads it all (below).
        let second = crate::runtime::start_scoped(scope, "little-world-list", || {
            list_packed(reader, run_id, mid, Some(end - mid))
        })
        .ok()?;
        let first = list_packed(reader, run_id, after, Some(mid - after));
        let second = second.join().unwrap_or_else(|p| Err(crate::runtime::panic_error(p)));
        Some((first, second))
    });
    whole(match halves {
        Some((first, second)) => first?.into_iter().chain(second?).collect(),
        None => list_packed(reader, run_id, after, limit)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_payload_of_a_canonical_envelope() {
        let env = r#"{"appendIdempotencyKey":"\"payload\":","canonicalRequestDigest":"sha256:x","eventId":"evt_1","payload":{"a":{"recordedAt":"x"},"runId":1},"recordedAt":"2026-01-01T00:00:00.000Z","runId":"run_a","sequence":12,"type":"t"}"#;
        let row = RowRef {
            run_id: "run_a",
            sequence: 12,
            event_id: "evt_1",
            event_type: "t",
            key: Some("\"payload\":"),
            digest: Some("sha256:x"),
            recorded_at: "2026-01-01T00:00:00.000Z",
            envelope: env,
        };
        let mut scratch = Vec::new();
        assert_eq!(
            payload_slice(&row, &mut scratch),
            Some(r#"{"a":{"recordedAt":"x"},"runId":1}"#)
        );
        let wrong = RowRef { sequence: 13, ..row };
        assert_eq!(payload_slice(&wrong, &mut scratch), None);
    }

    #[test]
    fn offsets_count_utf16_units() {
        assert_eq!(utf16_len("abc"), 3);
        assert_eq!(utf16_len("é😀"), 3);
    }

    /// A memory log holding `run`'s rows 1 ..= `rows`, of type `t`, each with the payload
    /// `{"n": text(sequence)}`.
    fn log_of(run: &str, rows: u64, text: impl Fn(u64) -> String) -> crate::store::r#virtual::VirtualLog {
        use crate::store::{LogWriter, Scope};
        let mut log = crate::store::r#virtual::VirtualLog::new();
        log.transaction(&Scope::NONE, &mut |tx| {
            for s in 1..=rows {
                let envelope = format!(
                    r#"{{"eventId":"evt_{s:016}","payload":{{"n":"{}"}},"recordedAt":"2026-01-01T00:00:00.000Z","runId":"{run}","sequence":{s},"type":"t"}}"#,
                    text(s)
                );
                tx.insert(&RowRef::plain(run, s, &format!("evt_{s:016}"), &envelope))?;
            }
            Ok(())
        })
        .unwrap();
        log
    }

    #[test]
    fn a_listing_too_long_for_one_string_comes_in_parts_of_whole_rows() {
        let log = log_of("run_p", 10, |s| "é".repeat(s as usize * 10));
        let whole = list_packed_in_parts(&log, "run_p", 0, None, usize::MAX).unwrap();
        assert_eq!(whole.len(), 1);
        let parts = list_packed_in_parts(&log, "run_p", 0, None, 300).unwrap();
        assert!(parts.len() > 3, "{}", parts.len());
        // Each part holds whole rows, at most 300 code units unless one row alone is longer, and
        // its offsets start at 0; the rows and pieces are the same as in one part.
        let pieces = |p: &Packed| -> Vec<(f64, Vec<String>)> {
            let utf16: Vec<u16> = p.text.encode_utf16().collect();
            p.table
                .chunks(STRIDE)
                .map(|r| {
                    let cut = |a: f64, b: f64| String::from_utf16(&utf16[a as usize..b as usize]).unwrap();
                    (
                        r[0],
                        (1..STRIDE)
                            .map(|i| cut(r[i], r.get(i + 1).copied().unwrap_or(r[STRIDE - 1])))
                            .collect(),
                    )
                })
                .collect()
        };
        for p in &parts {
            let rows = p.table.len() / STRIDE;
            assert!(utf16_len(&p.text) <= 300 || rows == 1);
            assert_eq!(p.table[1], 0.0);
            assert_eq!(p.table[p.table.len() - 1] as usize, utf16_len(&p.text));
        }
        let split: Vec<_> = parts.iter().flat_map(pieces).collect();
        assert_eq!(split, pieces(&whole[0]));
        assert_eq!(split.len(), 10);
    }

    #[test]
    fn a_listing_within_a_budget_ends_with_the_row_that_reaches_it() {
        // Rows whose payloads are 10, 20, ... 200 characters long.
        let log = log_of("run_w", 20, |s| "x".repeat(s as usize * 10 - 8));
        // Per row: the event id (20), recordedAt (24), type (1) and payload (10 * sequence).
        let text = |s: u64| 45 + 10 * s as usize;
        let listed = |after: u64, limit: Option<u64>, max: usize| -> (Vec<f64>, usize) {
            let parts = list_packed_within(&log, "run_w", after, limit, max).unwrap();
            assert_eq!(parts.len(), 1);
            let units = utf16_len(&parts[0].text);
            (parts[0].table.chunks(STRIDE).map(|r| r[0]).collect(), units)
        };
        // 55 + 65 + 75 = 195 units reach 150 at the third row.
        assert_eq!(listed(0, None, 150), (vec![1.0, 2.0, 3.0], 195));
        assert_eq!(listed(0, None, 195), (vec![1.0, 2.0, 3.0], 195));
        assert_eq!(listed(0, None, 196).0, vec![1.0, 2.0, 3.0, 4.0]);
        // At least one row, however small the budget; from where the caller is.
        assert_eq!(listed(0, None, 1), (vec![1.0], text(1)));
        assert_eq!(listed(17, None, 1), (vec![18.0], text(18)));
        // The limit holds; everything there is comes back shorter than a budget it does not reach.
        assert_eq!(listed(0, Some(2), 1 << 20).0, vec![1.0, 2.0]);
        let (all, units) = listed(5, None, 1 << 20);
        assert_eq!(all, (6..=20).map(|s| s as f64).collect::<Vec<_>>());
        assert_eq!(units, (6..=20).map(text).sum::<usize>());
        assert!(units < 1 << 20);
        // The same rows as the whole listing's, in order, page after page.
        let mut after = 0;
        let mut seen = Vec::new();
        while after < 20 {
            let (rows, _) = listed(after, Some(7), 300);
            after = *rows.last().unwrap() as u64;
            seen.extend(rows);
        }
        assert_eq!(seen, (1..=20).map(|s| s as f64).collect::<Vec<_>>());
    }

    /// A reader that counts the queries made of it, and the rows it reads.
    struct Counting<'a>(
        &'a dyn LogReader,
        std::sync::atomic::AtomicUsize,
        std::sync::atomic::AtomicUsize,
    );

    impl LogReader for Counting<'_> {
        fn rows(
            &self,
            run_id: &str,
            after: u64,
            limit: Option<u64>,
            sink: &mut dyn FnMut(RowRef<'_>) -> Result<()>,
        ) -> Result<()> {
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.0.rows(run_id, after, limit, &mut |row| {
                self.2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                sink(row)
            })
        }
        fn streams(&self) -> Result<Vec<crate::store::StreamSummary>> {
            self.0.streams()
        }
        fn catalog_page(&self, query: &crate::catalog::RunQuery<'_>) -> Result<Vec<crate::catalog::CatalogRow>> {
            self.0.catalog_page(query)
        }
        fn catalog_row(&self, run_id: &str) -> Result<Option<crate::catalog::CatalogRow>> {
            self.0.catalog_row(run_id)
        }
        fn last_sequence(&self, run_id: &str) -> Result<u64> {
            self.0.last_sequence(run_id)
        }
        fn find_by_key(&self, run_id: &str, key: &str) -> Result<Option<crate::store::KeyedEvent>> {
            self.0.find_by_key(run_id, key)
        }
        fn index_entry(&self, index: &str, key: &str) -> Result<Option<crate::store::IndexEntry>> {
            self.0.index_entry(index, key)
        }
        fn index_entries(&self, query: &crate::store::IndexQuery<'_>) -> Result<Vec<crate::store::IndexEntry>> {
            self.0.index_entries(query)
        }
        fn held_index_entries(&self, run_id: &str) -> Result<Vec<crate::store::IndexEntry>> {
            self.0.held_index_entries(run_id)
        }
    }

    #[test]
    fn a_listing_within_a_budget_reads_about_what_it_returns_in_few_queries() {
        let log = log_of("run_q", 300, |s| "x".repeat(if s <= 200 { 10 } else { 10_000 }));
        let counting = Counting(&log, Default::default(), Default::default());
        let page = |after: u64, max: usize| {
            counting.1.store(0, std::sync::atomic::Ordering::Relaxed);
            counting.2.store(0, std::sync::atomic::Ordering::Relaxed);
            let parts = list_packed_within(&counting, "run_q", after, Some(256), max).unwrap();
            (
                parts[0].table.len() / STRIDE,
                counting.1.load(std::sync::atomic::Ordering::Relaxed),
            )
        };
        // Small rows: one row, then 8, 72 and the rest of the page.
        assert_eq!(page(0, 1 << 22), (200 + 56, 4));
        // Large rows (about 10,000 units each): a budget of 30,000 takes three, read as one and then
        // two more, not a page of 256.
        assert_eq!(page(200, 30_000), (3, 2));
        assert_eq!(counting.2.load(std::sync::atomic::Ordering::Relaxed), 3);
        // A small row and then large ones: at most 8 rows read past the one kept before them (the
        // average of the first row alone said over 500 more would fit).
        assert_eq!(page(199, 30_000), (4, 2));
        assert!(counting.2.load(std::sync::atomic::Ordering::Relaxed) <= 9);
    }
}
