//! Reading a blob into a buffer and hashing what was read, as fast as the hash allows.
//!
//! Hashing is the slow part, and a hash reads fastest from this core's cache: SHA-256 over
//! blocks that fit in cache runs well over half again as fast as over blocks that must come
//! from memory, and a chunk copied in by one thread and hashed by another comes from the other
//! core no faster. So each chunk is hashed by the thread whose read just copied it in. One thread
//! alone must fault in, copy and hash every chunk in turn; two threads, each reading every other
//! chunk and taking turns at the hash, overlap one's faults and copy with the other's hash, the
//! hash passing between them with each chunk.

use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{Error, ErrorKind, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread::Thread;
use std::time::{Duration, Instant};

/// Bytes read and then hashed at a time: small enough to be in cache still when hashed.
const HASH_CHUNK: usize = 256 * 1024;

/// Buffers this large are read by two threads taking turns.
const SHARED_AT: usize = 4 * 1024 * 1024;

/// How long a thread waiting for its turn spins before it sleeps, while this is the only read
/// taking turns in the process. The other thread hashes a chunk in a fraction of a millisecond,
/// but faulting in fresh pages for its next one can take it far longer, and a thread woken from
/// sleep each time (or one that spun for less, or yielded its core) was slower.
const SPIN: Duration = Duration::from_millis(2);

/// How long it spins while other reads take turns too (their threads outnumber the cores, and a
/// spinning thread would hold a core that another needs), or while the blob comes from the disk.
const SPIN_SHARED: Duration = Duration::from_micros(20);

/// A chunk's read taking longer than this came from the disk, not the page cache (256 KiB at
/// under 256 MB/s; from the page cache it takes a small fraction of this).
const SLOW_READ: Duration = Duration::from_millis(1);

/// Reads taking turns in the process now.
static READS_TAKING_TURNS: AtomicUsize = AtomicUsize::new(0);

/// What a blob is read from: a file, read at an offset (on Unix without moving its position;
/// on Windows the position moves, and nothing here depends on it).
pub trait ReadAt: Sync {
    /// Read into `buf` from `offset`, returning how many bytes were read (0 at the end).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize>;
}

impl ReadAt for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        #[cfg(unix)]
        return std::os::unix::fs::FileExt::read_at(self, buf, offset);
        #[cfg(windows)]
        return std::os::windows::fs::FileExt::seek_read(self, buf, offset);
    }
}

/// Fill `buf` from the start of `file` and return the sha256 of what was read; `buf` must not be
/// longer than the file.
pub fn read_hashed(file: &impl ReadAt, buf: &mut [u8]) -> Result<[u8; 32]> {
    let hasher = Mutex::new(Sha256::new());
    if buf.len() >= SHARED_AT {
        let turns = Turns {
            next: AtomicUsize::new(0),
        };
        READS_TAKING_TURNS.fetch_add(1, Ordering::Relaxed);
        let _counted = Counted;
        let shared = std::thread::scope(|scope| {
            let (mut mine, mut theirs) = (Vec::new(), Vec::new());
            for (i, chunk) in buf.chunks_mut(HASH_CHUNK).enumerate() {
                if i % 2 == 0 { &mut mine } else { &mut theirs }.push((i, chunk));
            }
            let this = std::thread::current();
            let (turns, hasher) = (&turns, &hasher);
            // At the process's thread limit, this thread reads it all (below).
            let helper = crate::runtime::start_scoped(scope, "little-world-blob", move || {
                turns.take(file, theirs, hasher, &this)
            })
            .ok()?;
            let helper_thread = helper.thread().clone();
            let read = turns.take(file, mine, hasher, &helper_thread);
            let helped = helper
                .join()
                .unwrap_or_else(|_| Err(Error::other("the blob reader thread panicked")));
            Some(read.and(helped))
        });
        if let Some(read) = shared {
            read?;
            return Ok(hasher.into_inner().expect("no hash was poisoned").finalize().into());
        }
    }
    let mut hasher = hasher.into_inner().expect("a fresh hasher");
    for (i, chunk) in buf.chunks_mut(HASH_CHUNK).enumerate() {
        read_exact_at(file, chunk, (i * HASH_CHUNK) as u64)?;
        hasher.update(&*chunk);
    }
    Ok(hasher.finalize().into())
}

/// Whose turn it is to hash: the index of the next chunk, or `STOPPED`.
struct Turns {
    next: AtomicUsize,
}

/// The turn after a thread failed: whoever waits gives up.
const STOPPED: usize = usize::MAX;

impl Turns {
    /// Read each of `chunks` (index, bytes) and hash it in its turn, handing each next turn to
    /// `other`. On an error, or a panic, the turns stop, so that `other` does not wait for ever;
    /// a thread that finds them stopped (before a read, or waiting or handing on its turn)
    /// returns, and the one that stopped them returns the error.
    fn take(
        &self,
        file: &impl ReadAt,
        chunks: Vec<(usize, &mut [u8])>,
        hasher: &Mutex<Sha256>,
        other: &Thread,
    ) -> Result<()> {
        let mut leaving = Leaving {
            turns: self,
            other,
            finished: false,
        };
        for (i, chunk) in chunks {
            if self.next.load(Ordering::Acquire) == STOPPED {
                break;
            }
            prefault(chunk);
            let reading = Instant::now();
            read_exact_at(file, chunk, (i * HASH_CHUNK) as u64)?;
            // A read this slow came from the disk, and so will the other thread's: waiting for it,
            // a spinning thread would hold a core for nothing.
            let from_disk = reading.elapsed() > SLOW_READ;
            if !self.wait_for(i, from_disk) {
                break;
            }
            hasher.lock().expect("no hash was poisoned").update(&*chunk);
            // Only this thread may move the turn on from `i`, but the other may stop the turns
            // meanwhile; a plain store would undo the stop and leave this thread waiting for ever
            // for a turn the other will not give.
            if self
                .next
                .compare_exchange(i, i + 1, Ordering::Release, Ordering::Relaxed)
                .is_err()
            {
                break;
            }
            other.unpark();
        }
        leaving.finished = true;
        Ok(())
    }

    /// Wait until chunk `i` may be hashed; false if the turns stopped. `from_disk`: the last read
    /// came from the disk, so the wait will be long.
    fn wait_for(&self, i: usize, from_disk: bool) -> bool {
        let since = Instant::now();
        let spin = if from_disk || READS_TAKING_TURNS.load(Ordering::Relaxed) > 1 {
            SPIN_SHARED
        } else {
            SPIN
        };
        loop {
            match self.next.load(Ordering::Acquire) {
                n if n == i => return true,
                STOPPED => return false,
                _ if since.elapsed() < spin => std::hint::spin_loop(),
                // Woken by the other thread's next turn (or at once, if it came meanwhile).
                _ => std::thread::park(),
            }
        }
    }
}

/// Counts a read out of `READS_TAKING_TURNS` when it ends, however it ends.
struct Counted;

impl Drop for Counted {
    fn drop(&mut self) {
        READS_TAKING_TURNS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Stops the turns when a thread leaves them before its last chunk was hashed.
struct Leaving<'a> {
    turns: &'a Turns,
    other: &'a Thread,
    finished: bool,
}

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.turns.next.store(STOPPED, Ordering::Release);
            self.other.unpark();
        }
    }
}

/// Whether `file` holds bytes past its first `len`.
pub fn holds_more(file: &impl ReadAt, len: u64) -> Result<bool> {
    match read_exact_at(file, &mut [0u8; 1], len) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

/// Fill `buf` from `file` at `offset`.
fn read_exact_at(file: &impl ReadAt, mut buf: &mut [u8], mut offset: u64) -> Result<()> {
    while !buf.is_empty() {
        match file.read_at(buf, offset) {
            Ok(0) => return Err(Error::new(ErrorKind::UnexpectedEof, "the blob ended early")),
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Fault in, writable, the whole pages of `chunk`, all in one call rather than one fault per page
/// as the read touches them. Faulting a page in leaves what it holds as it is. Where the kernel
/// cannot (before Linux 5.14), the read faults the pages in as it goes.
fn prefault(chunk: &mut [u8]) {
    #[cfg(target_os = "linux")]
    {
        let Some(page) = crate::bytes::memory_page() else {
            return;
        };
        let at = chunk.as_mut_ptr() as usize;
        let (from, end) = (at.next_multiple_of(page), (at + chunk.len()) / page * page);
        if from < end {
            // SAFETY: the range lies within `chunk`, which this thread holds, and
            // MADV_POPULATE_WRITE reads and writes none of its bytes.
            unsafe { libc::madvise(from as *mut libc::c_void, end - from, libc::MADV_POPULATE_WRITE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = chunk;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn blob(len: usize) -> (tempfile::NamedTempFile, Vec<u8>) {
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8 ^ (i >> 17) as u8).collect();
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&data).unwrap();
        (f, data)
    }

    #[test]
    fn reads_and_hashes_every_size_on_one_thread_or_two() {
        // Below and at the size read by two threads, with a last chunk that is whole or partial
        // and falls to either thread.
        for len in [
            0,
            1,
            HASH_CHUNK - 1,
            HASH_CHUNK + 1,
            SHARED_AT - 1,
            SHARED_AT,
            SHARED_AT + 1,
            SHARED_AT + HASH_CHUNK,
            SHARED_AT + HASH_CHUNK + 7,
        ] {
            let (f, data) = blob(len);
            let mut buf = vec![0xAAu8; len];
            let digest = read_hashed(f.as_file(), &mut buf).unwrap();
            assert!(buf == data, "{len} bytes read back");
            assert_eq!(digest, <[u8; 32]>::from(Sha256::digest(&data)), "{len} bytes hashed");
            assert!(!holds_more(f.as_file(), len as u64).unwrap());
            assert!(len == 0 || holds_more(f.as_file(), len as u64 - 1).unwrap());
        }
    }

    /// Copy what `data` holds from `offset` into `buf`, as a read does; how many bytes.
    fn copy_at(data: &[u8], buf: &mut [u8], offset: u64) -> usize {
        let rest = data.get(offset as usize..).unwrap_or_default();
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        n
    }

    /// Bytes that fail to read at one offset, as a disk might.
    struct FailingAt(Vec<u8>, u64);

    impl ReadAt for FailingAt {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
            if offset == self.1 {
                return Err(Error::other("a bad sector"));
            }
            Ok(copy_at(&self.0, buf, offset))
        }
    }

    #[test]
    fn a_failed_read_on_either_thread_ends_the_read_with_its_error() {
        // Chunk 2 is this thread's, chunk 3 the helper's: the other thread, which read its later
        // chunk, stops waiting for a turn that will not come.
        let data = blob(2 * SHARED_AT).1;
        for failing in [2, 3, 2 * SHARED_AT / HASH_CHUNK - 1] {
            let (done, finished) = std::sync::mpsc::channel();
            let source = FailingAt(data.clone(), (failing * HASH_CHUNK) as u64);
            std::thread::spawn(move || {
                let mut buf = vec![0u8; source.0.len()];
                done.send(read_hashed(&source, &mut buf)).unwrap();
            });
            let read = finished.recv_timeout(Duration::from_secs(60)).expect("the read ended");
            assert_eq!(read.unwrap_err().to_string(), "a bad sector", "chunk {failing}");
        }
    }

    /// Bytes whose read at one offset fails only once the chunk before it has been read and the
    /// thread that read it has had time to begin hashing it: the failure lands while the other
    /// thread holds its turn.
    struct FailingMidTurn {
        data: Vec<u8>,
        failing: usize,
        before_read: std::sync::atomic::AtomicBool,
    }

    impl ReadAt for FailingMidTurn {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
            let chunk = offset as usize / HASH_CHUNK;
            if chunk == self.failing {
                let since = Instant::now();
                while !self.before_read.load(Ordering::Acquire) && since.elapsed() < Duration::from_secs(5) {
                    std::thread::yield_now();
                }
                std::thread::sleep(Duration::from_micros(50));
                return Err(Error::other("a bad sector"));
            }
            let n = copy_at(&self.data, buf, offset);
            if chunk + 1 == self.failing {
                self.before_read.store(true, Ordering::Release);
            }
            Ok(n)
        }
    }

    #[test]
    fn a_read_failing_while_the_other_thread_hashes_ends_the_read() {
        // The other thread, hashing in its turn when the read fails, must not hand on a turn
        // over the stop: it would then wait for ever for the failed thread's next chunk.
        let data = blob(2 * SHARED_AT).1;
        for failing in [1, 2, 3, 4, 9] {
            for round in 0..20 {
                let (done, finished) = std::sync::mpsc::channel();
                let source = FailingMidTurn {
                    data: data.clone(),
                    failing,
                    before_read: Default::default(),
                };
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; source.data.len()];
                    let _ = done.send(read_hashed(&source, &mut buf));
                });
                let read = finished
                    .recv_timeout(Duration::from_secs(10))
                    .unwrap_or_else(|_| panic!("chunk {failing}, round {round}: the read never ended"));
                assert_eq!(read.unwrap_err().to_string(), "a bad sector");
            }
        }
    }

    /// Bytes whose read at one offset panics.
    struct PanickingAt(Vec<u8>, u64);

    impl ReadAt for PanickingAt {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
            assert_ne!(offset, self.1, "a reader bug");
            Ok(copy_at(&self.0, buf, offset))
        }
    }

    #[test]
    fn a_panic_on_either_thread_ends_the_read() {
        // Chunk 2 is this thread's: its panic goes on to the caller. Chunk 3 is the helper's: the
        // read fails with an error saying so.
        let data = blob(SHARED_AT + 3 * HASH_CHUNK).1;
        for failing in [2, 3] {
            let (done, finished) = std::sync::mpsc::channel();
            let source = PanickingAt(data.clone(), (failing * HASH_CHUNK) as u64);
            std::thread::spawn(move || {
                let mut buf = vec![0u8; source.0.len()];
                let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read_hashed(&source, &mut buf)));
                let _ = done.send(read.map(|r| r.map_err(|e| e.to_string())));
            });
            let read = finished.recv_timeout(Duration::from_secs(60)).expect("the read ended");
            match failing {
                2 => assert!(read.is_err(), "this thread's panic goes on"),
                _ => assert_eq!(read.unwrap().unwrap_err(), "the blob reader thread panicked"),
            }
        }
    }

    #[test]
    fn a_blob_shorter_than_its_buffer_fails() {
        for chunks in [SHARED_AT / HASH_CHUNK + 1, SHARED_AT / HASH_CHUNK + 2] {
            let (f, _) = blob((chunks - 1) * HASH_CHUNK + 5);
            let mut buf = vec![0u8; chunks * HASH_CHUNK];
            let err = read_hashed(f.as_file(), &mut buf).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::UnexpectedEof, "{chunks} chunks");
        }
    }

    #[test]
    fn at_the_thread_limit_one_thread_reads_and_hashes_it_all() {
        let (f, data) = blob(SHARED_AT + 3);
        crate::runtime::fail_thread_starts(0, 1);
        let mut buf = vec![0u8; data.len()];
        let digest = read_hashed(f.as_file(), &mut buf).unwrap();
        assert!(buf == data);
        assert_eq!(digest, <[u8; 32]>::from(Sha256::digest(&data)));
    }
}
