//! Opening the files a world keeps (blobs, manifests, lock owners) without trusting what is at
//! their paths. A FIFO put where one belongs hangs whoever opens it for reading (the open waits
//! for a writer): a read of it never settled and the world's close waited for it for ever. A
//! directory reads as an I/O error or, by its size, as 4096 bytes, a device as anything at all,
//! and a symbolic link to nothing as no file, which a write then took for one published by
//! someone else. Here each is what it is.

use std::fs::{self, File};
use std::io::{ErrorKind, Read};
use std::path::Path;

/// Why a kept file could not be read as one.
#[derive(Debug)]
pub enum Unreadable {
    /// Nothing is at the path.
    Missing,
    /// Something is there that is not a regular file: what it is ("a directory", "a FIFO", "a
    /// symbolic link to nothing", ...).
    NotAFile(&'static str),
    /// A file larger than any of its kind: its size in bytes.
    TooLarge(u64),
    /// The system refused (permissions, I/O, too many open files, ...).
    Io(std::io::Error),
}

impl Unreadable {
    /// As an I/O error of the same meaning (`NotFound` for [`Unreadable::Missing`]).
    pub fn into_io(self, path: &Path) -> std::io::Error {
        match self {
            Unreadable::Missing => ErrorKind::NotFound.into(),
            Unreadable::Io(e) => e,
            other => std::io::Error::new(ErrorKind::InvalidData, other.describe(path)),
        }
    }

    /// What is wrong with the file at `path`, for a message (not for [`Unreadable::Io`], whose
    /// error says it).
    pub fn describe(&self, path: &Path) -> String {
        match self {
            Unreadable::Missing => format!("{} does not exist", path.display()),
            Unreadable::NotAFile(what) => format!("{} is {what}, not a file", path.display()),
            Unreadable::TooLarge(len) => {
                format!("{} holds {len} bytes, more than such a file ever does", path.display())
            }
            Unreadable::Io(e) => format!("{}: {e}", path.display()),
        }
    }
}

/// Open the regular file at `path` (following symbolic links) for reading, with its length,
/// without blocking on a FIFO or a device.
pub fn open_file(path: &Path) -> Result<(File, u64), Unreadable> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let open = || {
        fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
    };
    let mut opened = open();
    // A name found after a failed open is a symbolic link to nothing, or a file published
    // meanwhile (then opened again, at most a few times: files are published, rarely removed).
    for _ in 0..4 {
        match &opened {
            Err(e) if e.kind() == ErrorKind::NotFound => match fs::symlink_metadata(path) {
                Err(_) => return Err(Unreadable::Missing),
                Ok(m) if m.file_type().is_symlink() && fs::metadata(path).is_err() => {
                    return Err(Unreadable::NotAFile("a symbolic link to nothing"))
                }
                Ok(_) => opened = open(),
            },
            _ => break,
        }
    }
    let file = match opened {
        Ok(f) => f,
        // A socket cannot be opened at all (ENXIO).
        Err(e) => {
            return Err(match fs::metadata(path) {
                Ok(m) if m.file_type().is_socket() => Unreadable::NotAFile("a socket"),
                _ => Unreadable::Io(e),
            })
        }
    };
    let meta = file.metadata().map_err(Unreadable::Io)?;
    match kind_of(&meta) {
        None => Ok((file, meta.len())),
        Some(what) => Err(Unreadable::NotAFile(what)),
    }
}

/// Open a file the world made itself (a temporary file, a lock record), without following a
/// symbolic link at its end or waiting on a FIFO or device: only a regular file is opened, and
/// anything else at the path is an `InvalidData` error saying what it is. `create` makes it if
/// it is missing.
pub fn open_own(path: &Path, write: bool, create: bool) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = fs::OpenOptions::new()
        .read(true)
        .write(write || create)
        .create(create)
        .truncate(false)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            // O_NOFOLLOW refuses a symbolic link with ELOOP.
            Some(libc::ELOOP) => std::io::Error::new(
                ErrorKind::InvalidData,
                Unreadable::NotAFile("a symbolic link").describe(path),
            ),
            _ => e,
        })?;
    let kind = kind_of(&file.metadata()?);
    match kind {
        None => Ok(file),
        Some(what) => Err(std::io::Error::new(
            ErrorKind::InvalidData,
            Unreadable::NotAFile(what).describe(path),
        )),
    }
}

/// Refuse what is at `path` (following symbolic links) unless it is nothing or a regular file:
/// SQLite, opening a FIFO where its database, WAL or `-shm` belongs, would wait on it for ever.
/// Looked at with `stat`, which opens nothing.
pub fn regular_or_absent(path: &Path) -> Result<(), Unreadable> {
    match fs::metadata(path) {
        Ok(m) => match kind_of(&m) {
            None => Ok(()),
            Some(what) => Err(Unreadable::NotAFile(what)),
        },
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Unreadable::Io(e)),
    }
}

/// What a file that is not a regular file is ("a directory", "a FIFO", ...); `None` for a
/// regular file.
fn kind_of(meta: &fs::Metadata) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_file() {
        None
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_fifo() {
        Some("a FIFO")
    } else if t.is_char_device() || t.is_block_device() {
        Some("a device")
    } else if t.is_socket() {
        Some("a socket")
    } else {
        Some("a special file")
    }
}

/// A file's identity: its device and inode.
pub fn identity(meta: &fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

/// Whether `path` (not following a last symbolic link) names the file `file` is open on.
pub fn names(file: &File, path: &Path) -> bool {
    match (file.metadata(), fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => identity(&a) == identity(&b),
        _ => false,
    }
}

/// The whole regular file at `path`, of at most `max` bytes.
pub fn read_small(path: &Path, max: u64) -> Result<Vec<u8>, Unreadable> {
    let (file, len) = open_file(path)?;
    read_opened(&file, len, max)
}

/// The whole of `file` (opened by [`open_file`], `len` long then), of at most `max` bytes.
pub fn read_opened(file: &File, len: u64, max: u64) -> Result<Vec<u8>, Unreadable> {
    if len > max {
        return Err(Unreadable::TooLarge(len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    // One byte past the limit tells a file that grew since its length was taken.
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(Unreadable::Io)?;
    if bytes.len() as u64 > max {
        return Err(Unreadable::TooLarge(bytes.len() as u64));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_not_a_regular_file_is_named_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n);
        fs::write(p("file"), b"12345").unwrap();
        fs::create_dir(p("dir")).unwrap();
        let fifo = std::ffi::CString::new(p("fifo").to_str().unwrap()).unwrap();
        // SAFETY: a valid C string naming a path in a temporary directory.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        std::os::unix::fs::symlink(p("nowhere"), p("dangling")).unwrap();
        std::os::unix::fs::symlink(p("file"), p("link")).unwrap();
        let socket = std::os::unix::net::UnixListener::bind(p("socket")).unwrap();

        assert_eq!(read_small(&p("file"), 5).unwrap(), b"12345");
        assert_eq!(read_small(&p("link"), 5).unwrap(), b"12345");
        assert!(matches!(read_small(&p("file"), 4), Err(Unreadable::TooLarge(5))));
        assert!(matches!(read_small(&p("missing"), 5), Err(Unreadable::Missing)));
        for (name, what) in [
            ("dir", "a directory"),
            ("fifo", "a FIFO"),
            ("dangling", "a symbolic link to nothing"),
            ("socket", "a socket"),
        ] {
            match open_file(&p(name)) {
                Err(Unreadable::NotAFile(w)) => assert_eq!(w, what, "{name}"),
                other => panic!("{name}: {other:?}"),
            }
        }
        assert!(matches!(
            open_file(Path::new("/dev/zero")),
            Err(Unreadable::NotAFile("a device"))
        ));
        let e = Unreadable::NotAFile("a FIFO").into_io(&p("fifo"));
        assert_eq!(e.kind(), ErrorKind::InvalidData);
        assert!(e.to_string().ends_with("fifo is a FIFO, not a file"), "{e}");
        drop(socket);
    }
}
