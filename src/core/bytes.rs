//! Bytes handed to a caller without another copy: shared with the in-memory artifact store, or
//! the buffer a blob was just read into.

use std::ops::Deref;
use std::sync::Arc;

/// Buffers at least this large are fresh anonymous pages rather than heap memory.
const MAP_AT: usize = 1024 * 1024;

/// A read's bytes.
pub enum Bytes {
    /// Shared with whoever else holds them (the in-memory artifact store).
    Shared(Arc<Vec<u8>>),
    /// Owned: a small buffer.
    Owned(Vec<u8>),
    /// Owned: a large buffer of pages mapped for it alone.
    Mapped(memmap2::MmapMut),
}

impl Bytes {
    /// `len` zero bytes to read into. A large buffer is mapped afresh: the kernel hands its pages
    /// over already zeroed (a heap buffer would be cleared by a pass over it first), and on Linux
    /// asks for transparent huge pages, so filling 16 MiB takes a few page faults, not 4,096.
    pub fn zeroed(len: usize) -> std::io::Result<Bytes> {
        if len < MAP_AT {
            return Ok(Bytes::Owned(vec![0; len]));
        }
        let map = memmap2::MmapOptions::new().len(len).map_anon()?;
        #[cfg(target_os = "linux")]
        {
            // Only a hint: without huge pages the buffer works the same, with more page faults.
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        Ok(Bytes::Mapped(map))
    }

    /// The bytes to write into; copies them first if they are shared.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match self {
            Bytes::Shared(v) => Arc::make_mut(v).as_mut_slice(),
            Bytes::Owned(v) => v.as_mut_slice(),
            Bytes::Mapped(m) => &mut m[..],
        }
    }

    /// The bytes as a vector, copying only what is not already one of its own.
    pub fn into_vec(self) -> Vec<u8> {
        match self {
            Bytes::Shared(v) => Arc::try_unwrap(v).unwrap_or_else(|v| v.to_vec()),
            Bytes::Owned(v) => v,
            Bytes::Mapped(m) => m.to_vec(),
        }
    }
}

impl Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Shared(v) => v,
            Bytes::Owned(v) => v,
            Bytes::Mapped(m) => m,
        }
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
    fn small_and_large_buffers_start_zeroed_and_keep_what_is_written() {
        for len in [0, 1, MAP_AT - 1, MAP_AT, 3 * MAP_AT + 17] {
            let mut b = Bytes::zeroed(len).unwrap();
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0));
            assert_eq!(matches!(b, Bytes::Mapped(_)), len >= MAP_AT);
            for (i, x) in b.as_mut_slice().iter_mut().enumerate() {
                *x = (i % 251) as u8;
            }
            let v = b.into_vec();
            assert_eq!(v.len(), len);
            assert!(v.iter().enumerate().all(|(i, &x)| x == (i % 251) as u8));
        }
    }

    #[test]
    fn shared_bytes_are_copied_before_they_are_written() {
        let held = Arc::new(vec![1u8, 2, 3]);
        let mut b = Bytes::Shared(held.clone());
        b.as_mut_slice()[0] = 9;
        assert_eq!(&*held, &[1, 2, 3]);
        assert_eq!(&*b, &[9, 2, 3]);
        assert_eq!(Bytes::Shared(Arc::new(vec![4, 5])).into_vec(), vec![4, 5]);
    }
}
