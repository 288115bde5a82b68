//! Bytes a caller owns: the buffer a blob was just read into, handed on without another copy.
//!
//! Large buffers are anonymous pages mapped for them alone and unmapped when let go of
//! (JavaScript collected the `Buffer` they were lent as). Mapped fresh, their pages are zero and
//! untouched until the read writes them, whatever the heap has done before.

use std::ops::Deref;

/// Buffers at least this large are mapped pages rather than heap memory.
const MAP_AT: usize = 1024 * 1024;

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

/// A read's bytes, owned by the reader alone (JavaScript may write into them).
pub enum Bytes {
    /// A small buffer.
    Owned(Vec<u8>),
    /// A large buffer of mapped pages, unmapped when dropped.
    Mapped(Pages),
}

/// The first `len` bytes of a mapping this buffer alone uses.
pub struct Pages {
    map: memmap2::MmapMut,
    len: usize,
}

impl Bytes {
    /// `len` zeroed bytes for a caller that overwrites every one of them before reading any: a
    /// read that fills only part of the buffer must fail.
    pub fn to_fill(len: usize) -> std::io::Result<Bytes> {
        if len < MAP_AT {
            return Ok(Bytes::Owned(vec![0; len]));
        }
        // No transparent huge pages: asked for with MADV_HUGEPAGE, a fault may compact memory to
        // find 2 MiB free, and 2 MiB blocks are what a VM hands back to its host first, so huge
        // pages made a read slower after other processes had freed memory, not faster.
        let map = memmap2::MmapOptions::new().len(len).map_anon()?;
        Ok(Bytes::Mapped(Pages { map, len }))
    }

    /// The bytes to write into.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match self {
            Bytes::Owned(v) => v.as_mut_slice(),
            Bytes::Mapped(p) => &mut p.map[..p.len],
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
        &self.map[..self.len]
    }
}

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bytes({} bytes)", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_and_large_buffers_keep_what_is_written() {
        for len in [0, 1, MAP_AT - 1, MAP_AT, 3 * MAP_AT + 17] {
            let mut b = Bytes::to_fill(len).unwrap();
            assert_eq!(b.len(), len);
            assert_eq!(b.as_mut_slice().len(), len);
            assert_eq!(matches!(b, Bytes::Mapped(_)), len >= MAP_AT);
            assert!(b.iter().all(|&x| x == 0));
            for (i, x) in b.as_mut_slice().iter_mut().enumerate() {
                *x = (i % 251) as u8;
            }
            assert!(b.iter().enumerate().all(|(i, &x)| x == (i % 251) as u8));
            let v = b.into_vec();
            assert_eq!(v.len(), len);
            assert!(v.iter().enumerate().all(|(i, &x)| x == (i % 251) as u8));
        }
    }
}
