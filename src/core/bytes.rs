//! Bytes a caller owns: the buffer a blob was just read into, handed on without another copy.

use std::ops::Deref;

/// Buffers at least this large are fresh anonymous pages rather than heap memory.
const MAP_AT: usize = 1024 * 1024;

/// A read's bytes, owned by the reader alone (JavaScript may write into them).
pub enum Bytes {
    /// A small buffer.
    Owned(Vec<u8>),
    /// A large buffer of pages mapped for it alone.
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

    /// The bytes to write into.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match self {
            Bytes::Owned(v) => v.as_mut_slice(),
            Bytes::Mapped(m) => &mut m[..],
        }
    }

    /// The bytes as a vector, copying only mapped ones.
    pub fn into_vec(self) -> Vec<u8> {
        match self {
            Bytes::Owned(v) => v,
            Bytes::Mapped(m) => m.to_vec(),
        }
    }
}

impl Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
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
}
