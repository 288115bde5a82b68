//! Bytes a caller owns: the buffer a blob was just read into, handed on without another copy.
//!
//! Large buffers are anonymous pages mapped for them alone. Fresh pages are costly to come by:
//! the kernel clears each one on its first touch (and on a virtual machine that reports free
//! memory to its host, the host must back it again first), which on this project's test machines
//! took as long as hashing the bytes read into them. So the pages of a large buffer that is let
//! go of (JavaScript collected the `Buffer` it was lent as) are kept in a small process-wide pool
//! for the next large read, marked `MADV_FREE` meanwhile so the kernel may still take them back
//! under memory pressure.

use std::ops::Deref;
use std::sync::Mutex;

/// Buffers at least this large are mapped pages rather than heap memory.
const MAP_AT: usize = 1024 * 1024;

/// Mapped buffers are sized in steps of this, so that buffers for reads of similar sizes can
/// stand in for one another.
const MAP_STEP: usize = 2 * 1024 * 1024;

/// At most this many bytes of let-go mappings are kept for reuse.
const POOL_MAX_BYTES: usize = 64 * 1024 * 1024;

/// The system's memory page size, if it tells.
pub fn memory_page() -> Option<usize> {
    #[cfg(unix)]
    {
        // SAFETY: sysconf only reads a setting.
        let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if size > 0 {
            return Some(size as usize);
        }
    }
    None
}

/// The process's mappings kept for reuse.
static POOL: Pool = Pool::new(POOL_MAX_BYTES);

/// Mappings kept for reuse, each marked `MADV_FREE` while it waits.
struct Pool {
    maps: Mutex<Vec<memmap2::MmapMut>>,
    max_bytes: usize,
}

/// A read's bytes, owned by the reader alone (JavaScript may write into them).
pub enum Bytes {
    /// A small buffer.
    Owned(Vec<u8>),
    /// A large buffer of mapped pages, returned to the pool when dropped.
    Mapped(Pages),
}

/// The first `len` bytes of a mapping this buffer alone uses.
pub struct Pages {
    map: Option<memmap2::MmapMut>,
    len: usize,
    pool: &'static Pool,
}

impl Bytes {
    /// `len` bytes for a caller that overwrites every one of them before reading any: a read
    /// that fills only part of the buffer must fail. A small buffer starts zeroed; a large one
    /// holds zeros or the stale bytes of an earlier buffer of this process, which are never
    /// seen once the buffer has been filled.
    pub fn to_fill(len: usize) -> std::io::Result<Bytes> {
        Bytes::to_fill_from(&POOL, len)
    }

    fn to_fill_from(pool: &'static Pool, len: usize) -> std::io::Result<Bytes> {
        if len < MAP_AT {
            return Ok(Bytes::Owned(vec![0; len]));
        }
        let map = match pool.take(len) {
            Some(map) => map,
            None => {
                // No transparent huge pages: asked for with MADV_HUGEPAGE, a fault may compact
                // memory to find 2 MiB free (this machine's default for advised ranges), and
                // 2 MiB blocks are what a VM hands back to its host first. A/B on a 16 MiB read
                // after other processes had freed memory: 4 KiB pages 720 MB/s, huge 590 MB/s.
                memmap2::MmapOptions::new()
                    .len(len.div_ceil(MAP_STEP) * MAP_STEP)
                    .map_anon()?
            }
        };
        Ok(Bytes::Mapped(Pages {
            map: Some(map),
            len,
            pool,
        }))
    }

    /// The bytes to write into.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match self {
            Bytes::Owned(v) => v.as_mut_slice(),
            Bytes::Mapped(p) => {
                let len = p.len;
                &mut p.map.as_mut().expect("a live mapping")[..len]
            }
        }
    }

    /// The bytes as a vector, copying only mapped ones.
    pub fn into_vec(self) -> Vec<u8> {
        match self {
            Bytes::Owned(v) => v,
            Bytes::Mapped(p) => p.to_vec(),
        }
    }
}

impl Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Owned(v) => v,
            Bytes::Mapped(p) => p,
        }
    }
}

impl Deref for Pages {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.map.as_ref().expect("a live mapping")[..self.len]
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        if let Some(map) = self.map.take() {
            self.pool.give_back(map);
        }
    }
}

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bytes({} bytes)", self.len())
    }
}

impl Pool {
    const fn new(max_bytes: usize) -> Pool {
        Pool {
            maps: Mutex::new(Vec::new()),
            max_bytes,
        }
    }

    fn maps(&self) -> std::sync::MutexGuard<'_, Vec<memmap2::MmapMut>> {
        self.maps.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The smallest kept mapping that holds `len` bytes without wasting more than half of it.
    fn take(&self, len: usize) -> Option<memmap2::MmapMut> {
        let mut maps = self.maps();
        let fits = |m: &memmap2::MmapMut| m.len() >= len && m.len() - len < (len / 2).max(MAP_STEP);
        let (i, _) = maps
            .iter()
            .enumerate()
            .filter(|(_, m)| fits(m))
            .min_by_key(|(_, m)| m.len())?;
        Some(maps.swap_remove(i))
    }

    /// Keep `map` for a later buffer if there is room; otherwise unmap it.
    fn give_back(&self, map: memmap2::MmapMut) {
        let mut maps = self.maps();
        if maps.iter().map(|m| m.len()).sum::<usize>() + map.len() > self.max_bytes {
            return; // `map` is unmapped as it drops
        }
        #[cfg(target_os = "linux")]
        {
            // SAFETY: nothing borrows the mapping now; its next user overwrites what it reads (see
            // `Bytes::to_fill`), so pages the kernel takes back and hands over zeroed are never
            // mistaken for data. Only a hint: if it fails, the pages stay as they are.
            let _ = unsafe { map.unchecked_advise(memmap2::UncheckedAdvice::Free) };
        }
        maps.push(map);
    }

    #[cfg(test)]
    fn kept_bytes(&self) -> usize {
        self.maps().iter().map(|m| m.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool of a test's own (the process's pool is shared by every test running at once).
    fn own_pool(max_bytes: usize) -> &'static Pool {
        Box::leak(Box::new(Pool::new(max_bytes)))
    }

    #[test]
    fn small_and_large_buffers_keep_what_is_written() {
        let pool = own_pool(POOL_MAX_BYTES);
        for round in 0..2 {
            for len in [0, 1, MAP_AT - 1, MAP_AT, 3 * MAP_AT + 17] {
                let mut b = Bytes::to_fill_from(pool, len).unwrap();
                assert_eq!(b.len(), len);
                assert_eq!(b.as_mut_slice().len(), len);
                assert_eq!(matches!(b, Bytes::Mapped(_)), len >= MAP_AT);
                if len < MAP_AT {
                    assert!(b.iter().all(|&x| x == 0));
                }
                for (i, x) in b.as_mut_slice().iter_mut().enumerate() {
                    *x = ((i + round) % 251) as u8;
                }
                assert!(b.iter().enumerate().all(|(i, &x)| x == ((i + round) % 251) as u8));
                let v = b.into_vec();
                assert_eq!(v.len(), len);
                assert!(v.iter().enumerate().all(|(i, &x)| x == ((i + round) % 251) as u8));
            }
        }
        assert_eq!(
            pool.kept_bytes(),
            MAP_STEP + 2 * MAP_STEP,
            "a 2 MiB and a 4 MiB mapping kept, and reused"
        );
    }

    #[test]
    fn a_let_go_mapping_serves_the_next_large_buffer_of_a_similar_size() {
        let pool = own_pool(POOL_MAX_BYTES);
        let len = 5 * MAP_AT + 3;
        let mut first = Bytes::to_fill_from(pool, len).unwrap();
        first.as_mut_slice().fill(7);
        let addr = first.as_ptr();
        drop(first);
        assert_eq!(pool.kept_bytes(), 6 * MAP_AT, "kept for reuse");

        // Too small to be worth the kept mapping: gets a fresh one, and the kept one waits.
        let small = Bytes::to_fill_from(pool, MAP_AT).unwrap();
        assert_ne!(small.as_ptr(), addr);
        assert_eq!(pool.kept_bytes(), 6 * MAP_AT);

        // A similar size reuses it: the same pages, exactly the asked-for bytes visible, and they
        // keep what is written into them now.
        let mut second = Bytes::to_fill_from(pool, len - 1000).unwrap();
        assert_eq!(second.as_ptr(), addr);
        assert_eq!(second.len(), len - 1000);
        assert_eq!(pool.kept_bytes(), 0);
        for (i, x) in second.as_mut_slice().iter_mut().enumerate() {
            *x = (i % 13) as u8;
        }
        assert!(second.iter().enumerate().all(|(i, &x)| x == (i % 13) as u8));
    }

    #[test]
    fn the_pool_keeps_at_most_its_limit() {
        let pool = own_pool(POOL_MAX_BYTES);
        let each = 16 * MAP_AT;
        let held: Vec<Bytes> = (0..POOL_MAX_BYTES / each + 2)
            .map(|_| Bytes::to_fill_from(pool, each).unwrap())
            .collect();
        drop(held);
        assert_eq!(pool.kept_bytes(), POOL_MAX_BYTES);
    }
}
