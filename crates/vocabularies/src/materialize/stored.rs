//! Folding a run straight from a store's rows: from its latest snapshot where the store keeps
//! them, and, for a long run, on two threads (one reads and parses, the other folds).

use super::envelope::{parse_envelope, Envelope};
use super::pricing::Pricing;
use super::{snapshot, Fold};
use little_world_kernel::error::{Result, WorldError};

/// Runs with at least this many events are folded by two threads (see [`fold_stored`]).
pub(super) const PIPELINE_AT: u64 = 8192;

/// Envelopes handed from the reading thread to the folding one at a time.
pub(super) const BATCH: usize = 512;

/// Parsed envelopes in transit: their strings, end to end, and per event its sequence and where
/// its run id, event id, type, `recordedAt` and payload end in `text`.
#[derive(Default)]
struct Batch {
    text: String,
    events: Vec<(u64, [usize; 5])>,
}

impl Batch {
    fn push(&mut self, env: &Envelope<'_>) {
        let mut ends = [0; 5];
        for (end, piece) in ends.iter_mut().zip([
            &*env.run_id,
            &*env.event_id,
            &*env.event_type,
            &*env.recorded_at,
            env.payload.get(),
        ]) {
            self.text.push_str(piece);
            *end = self.text.len();
        }
        self.events.push((env.sequence, ends));
    }

    fn fold_into(&self, fold: &mut Fold<'_>) -> Result<()> {
        let mut start = 0;
        for &(sequence, [run, id, t, at, payload]) in &self.events {
            let s = &self.text;
            fold.apply(
                &s[start..run],
                sequence,
                &s[run..id],
                &s[id..t],
                &s[t..at],
                &s[at..payload],
            )?;
            start = payload;
        }
        Ok(())
    }
}

/// Fold a run straight from a store's rows, from its latest snapshot where the store keeps them
/// (see [`snapshot`]).
pub fn fold_stored(
    reader: &dyn little_world_kernel::store::LogReader,
    run_id: &str,
    pricing: &Pricing,
) -> Result<String> {
    Ok(fold_from_store(reader, run_id, pricing)?.state_json())
}

/// The fold of a run's stored events: from its latest usable snapshot, then the events after it.
/// A long stretch is folded by two threads, since the JavaScript thread only waits meanwhile: one
/// reads the rows and parses the envelopes (about half the work), handing them over in batches,
/// while the other folds them in order.
pub(super) fn fold_from_store<'p>(
    reader: &dyn little_world_kernel::store::LogReader,
    run_id: &str,
    pricing: &'p Pricing,
) -> Result<Fold<'p>> {
    let last = reader.last_sequence(run_id)?;
    let mut fold = snapshot::resume(reader, run_id, pricing, last)?.unwrap_or_else(|| Fold::new(run_id, pricing));
    let after = fold.event_count;
    if last.saturating_sub(after) >= PIPELINE_AT {
        let (tx, rx) = crossbeam_channel::bounded::<Result<Batch>>(4);
        let piped = std::thread::scope(|scope| {
            let reading = little_world_kernel::runtime::start_scoped(scope, "little-world-fold", move || {
                let mut batch = Batch::default();
                let mut sequence = after;
                let read = reader.envelopes(run_id, after, None, &mut |text| {
                    sequence += 1;
                    batch.push(&parse_envelope(run_id, sequence, text)?);
                    if batch.events.len() == BATCH && tx.send(Ok(std::mem::take(&mut batch))).is_err() {
                        // The folding thread stopped at an error of its own: stop reading.
                        return Err(WorldError::Closed);
                    }
                    Ok(())
                });
                // What was read before an envelope that does not parse is folded first, so the
                // error reported is the first in sequence order, as when folding on one thread.
                if tx.send(Ok(batch)).is_ok() {
                    if let Err(e) = read {
                        let _ = tx.send(Err(e));
                    }
                }
            })
            // At the process's thread limit, this thread does it all (below).
            .ok()?;
            let folded = rx.iter().try_for_each(|batch| batch?.fold_into(&mut fold));
            // On an error the receiver goes first, so the reading thread stops at its next batch.
            drop(rx);
            Some(
                reading
                    .join()
                    .map_err(little_world_kernel::runtime::panic_error)
                    .and(folded),
            )
        });
        if let Some(folded) = piped {
            folded?;
            return Ok(fold);
        }
    }
    reader.envelopes(run_id, fold.event_count, None, &mut |env| fold.push(env))?;
    Ok(fold)
}
