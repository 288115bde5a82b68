//! Where an append goes: prepared on the caller's thread or the prep thread, committed by the
//! writer thread or, for one its caller awaits alone, on the caller's thread.

use super::World;
use crate::clock;
use crate::error::{Result, WorldError};
use crate::events::{self, AppendRequest, PreparedAppend};
use crate::runtime::{panic_error, Output, Ticket};
use crossbeam_channel::Sender;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Payloads up to this size (as JSON text) are prepared on the caller's thread when nothing is in
/// flight: a few microseconds of work that would otherwise cost a thread hop. Larger ones (and
/// everything queued behind them) go through the prep thread, so call order is kept and large
/// payloads never occupy the caller.
pub const INLINE_PREP_MAX: usize = 16 * 1024;

/// Payloads up to this size (as JSON text) are prepared on the caller's thread while other
/// appends are in flight too, when the prep thread has nothing queued. With many runs appending
/// at once, each awaiting its last append, a prep thread spends most of each append's round trip
/// waiting for a core; preparing a small payload on the caller's thread saves that hop. Past
/// about 500 bytes the preparing costs the caller's thread more than the hop saves.
pub const INLINE_UNDER_LOAD_MAX: usize = 512;

/// Where appends go: the prep thread, or straight to the writer once prepared.
pub(super) struct Submit {
    pub(super) prep: Sender<PrepMsg>,
    pub(super) write: Sender<WriteMsg>,
    /// Appends sent to the prep thread and not yet passed on by it.
    pub(super) prep_pending: Arc<AtomicUsize>,
    /// Appends submitted and not yet settled (by the writer, or by the prep thread's refusal).
    pub(super) unsettled: Arc<AtomicUsize>,
}

impl Submit {
    /// Send an append to the prep thread, counted as unsettled and as pending there until it
    /// is passed on or answered.
    fn to_prep(&self, msg: PrepMsg) -> Result<()> {
        self.unsettled.fetch_add(1, Ordering::AcqRel);
        self.prep_pending.fetch_add(1, Ordering::AcqRel);
        if self.prep.send(msg).is_err() {
            self.prep_pending.fetch_sub(1, Ordering::AcqRel);
            self.unsettled.fetch_sub(1, Ordering::AcqRel);
            return Err(WorldError::Closed);
        }
        Ok(())
    }
}

/// What the writer does once every append queued before a close has committed, before the close
/// completes: let go of the world's locks (see [`World::close`]).
pub(super) type AfterClose = Box<dyn FnOnce() + Send>;

pub(super) enum PrepMsg {
    Append(Ticket, AppendRequest),
    /// Appends that commit together or not at all (see [`World::append_group`]).
    Group(Ticket, Vec<AppendRequest>),
    /// An append prepared on the caller's thread with a refusal, to be answered in call order
    /// (see [`events::answer_refused`]), and so before a close sent after it.
    Refused(Ticket, Box<PreparedAppend>),
    Close(Ticket, AfterClose),
}

// Appends move through the channel by value; boxing each would cost an allocation per append to
// save channel slots that are few and short-lived.
#[allow(clippy::large_enum_variant)]
pub(super) enum WriteMsg {
    /// An append, the bytes the prep thread counted into the [`Backlog`] for it (0 from the
    /// caller's thread), and whether its caller awaits it alone (see [`writer_loop`]).
    Append(Ticket, PreparedAppend, usize, bool),
    /// A group, prepared, and the bytes counted into the [`Backlog`] for it.
    Group(Ticket, Vec<PreparedAppend>, usize),
    Close(Ticket, AfterClose),
}

/// Most appends in one group.
pub const MAX_GROUP_APPENDS: usize = 1000;

impl World {
    /// Queue an append. Errors that need no I/O (a closed world, a malformed run id) return at
    /// once; everything else arrives through the completer under `ticket` with the envelope's
    /// canonical JSON.
    pub fn append(&self, ticket: Ticket, req: AppendRequest) -> Result<()> {
        self.append_with(ticket, req, false)
    }

    /// As [`World::append`], for a caller that waits for this append on its own thread. With
    /// nothing in flight and the writer idle, the append is committed right here when the store
    /// can commit it without waiting for a lock or a disk (at durability `normal`: see
    /// [`crate::store::LogWriter::transaction_if_immediate`]), and completed before this returns: the caller would
    /// otherwise spend the same time waiting for the writer's thread, plus two thread hand-offs.
    pub fn append_awaited(&self, ticket: Ticket, req: AppendRequest) -> Result<()> {
        self.append_with(ticket, req, true)
    }

    /// Queue appends that commit in one transaction, whole or not at all, in order and at
    /// consecutive places of their runs, after every append queued before them. Completes under
    /// `ticket` with the envelopes' canonical JSON, in order, or with the first refusal (nothing
    /// of the group stored). Always prepared on the prep thread: a group is rare enough that the
    /// hop costs nothing that matters, and it keeps call order with no case of its own.
    pub fn append_group(&self, ticket: Ticket, reqs: Vec<AppendRequest>) -> Result<()> {
        self.ensure_open()?;
        self.ensure_writable("an append")?;
        if reqs.is_empty() || reqs.len() > MAX_GROUP_APPENDS {
            return Err(WorldError::validation(
                "events",
                format!("must hold 1 to {MAX_GROUP_APPENDS} events, not {}", reqs.len()),
            ));
        }
        for req in &reqs {
            req.check_stream_id()?;
        }
        let guard = self.inner.submit.lock().expect("submit lock");
        let Some(submit) = guard.as_ref() else {
            return Err(WorldError::Closed);
        };
        submit.to_prep(PrepMsg::Group(ticket, reqs))
    }

    fn append_with(&self, ticket: Ticket, req: AppendRequest, awaited: bool) -> Result<()> {
        self.ensure_open()?;
        self.ensure_writable("an append")?;
        req.check_stream_id()?;
        let guard = self.inner.submit.lock().expect("submit lock");
        let Some(submit) = guard.as_ref() else {
            return Err(WorldError::Closed);
        };
        // A small append is prepared here when nothing is in flight, or (a smaller one) when
        // nothing is queued for the prep thread, and goes straight to the writer, after every
        // append sent before it, so call order is kept. This saves a thread hop: on the one
        // append a caller is waiting for, and under load (see `INLINE_UNDER_LOAD_MAX`). Larger
        // payloads, and everything sent after one until the prep thread has passed it on, are
        // prepared there, beside the caller. Only an append with nothing unsettled before it may
        // be committed here.
        let size = req.payload_json.len() + req.strings.iter().map(String::len).sum::<usize>();
        let idle = submit.unsettled.load(Ordering::Acquire) == 0;
        if size <= INLINE_PREP_MAX
            && (idle || (size <= INLINE_UNDER_LOAD_MAX && submit.prep_pending.load(Ordering::Acquire) == 0))
        {
            let prepared = events::prepare(req, &*self.inner.artifacts)?;
            if prepared.refused.is_some() {
                // Answered by the prep thread with a read of its key, and never by the writer.
                return submit.to_prep(PrepMsg::Refused(ticket, Box::new(prepared)));
            }
            let alone = awaited && idle;
            let prepared = if alone {
                self.commit_now(ticket, prepared)
            } else {
                Some(prepared)
            };
            let Some(prepared) = prepared else {
                return Ok(());
            };
            submit.unsettled.fetch_add(1, Ordering::AcqRel);
            if submit.write.send(WriteMsg::Append(ticket, prepared, 0, alone)).is_err() {
                submit.unsettled.fetch_sub(1, Ordering::AcqRel);
                return Err(WorldError::Closed);
            }
            return Ok(());
        }
        submit.to_prep(PrepMsg::Append(ticket, req))
    }

    /// Commit `prepared` on this thread and complete it, if the writer is idle and the store can
    /// (see [`events::commit_now`]); otherwise hand it back. Called with the submit lock held and
    /// nothing unsettled, so every earlier append has committed and none can start meanwhile.
    fn commit_now(&self, ticket: Ticket, mut prepared: PreparedAppend) -> Option<PreparedAppend> {
        if prepared.spill.is_some() {
            return Some(prepared); // It writes an artifact file first.
        }
        // Held by the writer's thread from a group's start to its end, and after close.
        let Ok(mut lent) = self.inner.writer.try_lock() else {
            return Some(prepared);
        };
        let Some(writer) = lent.as_mut() else {
            return Some(prepared);
        };
        let recorded_at = clock::now_iso();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            events::commit_now(&mut **writer, &*self.inner.artifacts, &mut prepared, &recorded_at)
        }))
        .unwrap_or_else(|p| Some(Err(panic_error(p))));
        drop(lent);
        match outcome {
            Some(outcome) => {
                self.inner.completer.complete(vec![(ticket, outcome.map(Output::Json))]);
                None
            }
            None => Some(prepared),
        }
    }
}
