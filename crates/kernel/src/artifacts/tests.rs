//! Artifacts on both backends: content addressing, verified reads, tampering, concurrent writers
//! and what a crash leaves behind.

use super::*;
use crate::durable::create_dir_synced;
use std::fs;
use std::path::Path;
use std::sync::Arc;

fn meta(encoding: Encoding) -> NewArtifact {
    NewArtifact {
        run_id: "run_art".into(),
        step_path: "step/a".into(),
        name: "out".into(),
        content_type: "application/octet-stream".into(),
        encoding,
    }
}

fn bytes(b: &[u8]) -> Data {
    Data::Bytes(b.to_vec())
}

#[test]
fn round_trips_and_is_content_addressed() {
    let dir = tempfile::tempdir().unwrap();
    for store in [
        ArtifactStore::new(local::LocalArtifacts::open(dir.path()).unwrap()),
        ArtifactStore::new(r#virtual::VirtualArtifacts::new()),
    ] {
        let a = store.write(meta(Encoding::Bytes), bytes(b"hello")).unwrap();
        let b = store.write(meta(Encoding::Bytes), bytes(b"hello")).unwrap();
        assert_eq!(a, b, "a second write returns the stored manifest");
        assert_eq!(a.sha256, ids::sha256_tagged(b"hello"));
        assert_eq!(a.size_bytes, 5);
        assert_eq!(a.artifact_id, artifact_id(&meta(Encoding::Bytes), &a.sha256));
        let (m, data) = store.read(&a.artifact_id).unwrap();
        assert_eq!(m, a);
        assert_eq!(&*data, b"hello");
        let j = store
            .write(meta(Encoding::Json), Data::Text("{\"b\":1.0,\"a\":[]}".into()))
            .unwrap();
        assert_eq!(&store.read(&j.artifact_id).unwrap().1[..], b"{\"a\":[],\"b\":1}");
        let e = store.write(meta(Encoding::Utf8), Data::Text(String::new())).unwrap();
        assert_eq!(e.size_bytes, 0);
        assert!(store.read(&e.artifact_id).unwrap().1.is_empty());
        assert_eq!(store.list().unwrap().len(), 3);
    }
}

#[test]
fn a_large_blob_reads_back_exactly_and_a_flipped_byte_anywhere_is_caught() {
    // Large enough to be read into mapped pages, by two threads taking turns.
    let data: Vec<u8> = (0..5 * 1024 * 1024 + 3).map(|i: u32| (i % 251) as u8).collect();
    let dir = tempfile::tempdir().unwrap();
    let store = ArtifactStore::new(local::LocalArtifacts::open(dir.path()).unwrap());
    let m = store.write(meta(Encoding::Bytes), bytes(&data)).unwrap();
    let (_, read) = store.read(&m.artifact_id).unwrap();
    assert!(read[..] == data[..]);
    // At the process's thread limit, one thread reads and hashes it.
    crate::runtime::fail_thread_starts(0, 1);
    let (_, read) = store.read(&m.artifact_id).unwrap();
    assert!(read[..] == data[..]);
    let blob = dir.path().join(format!("artifacts/blobs/{}.bin", m.artifact_id));
    for at in [0, data.len() / 2, data.len() - 1] {
        let mut flipped = data.clone();
        flipped[at] ^= 0x80;
        fs::write(&blob, &flipped).unwrap();
        assert_eq!(store.read(&m.artifact_id).unwrap_err().code(), "ARTIFACT_HASH_MISMATCH");
    }
}

#[test]
fn large_blobs_read_in_turn_come_back_exactly() {
    // Three blobs of sizes that share a buffer size class, read in turn and let go of each time:
    // each read after the first takes over the pages of an earlier one, stale bytes and all.
    let dir = tempfile::tempdir().unwrap();
    let store = ArtifactStore::new(local::LocalArtifacts::open(dir.path()).unwrap());
    let blobs: Vec<(String, Vec<u8>)> = [(3 << 20) + 5, 3 << 20, (2 << 20) + 777]
        .into_iter()
        .enumerate()
        .map(|(k, len)| {
            let data: Vec<u8> = (0..len).map(|i: usize| ((i * (k + 3)) % 253) as u8).collect();
            let mut m = meta(Encoding::Bytes);
            m.name = format!("blob{k}");
            (store.write(m, bytes(&data)).unwrap().artifact_id, data)
        })
        .collect();
    for _ in 0..3 {
        for (id, data) in &blobs {
            let (m, read) = store.read(id).unwrap();
            assert_eq!(read.len(), data.len());
            assert!(read[..] == data[..], "{id} read back exactly");
            assert_eq!(m.sha256, ids::sha256_tagged(&read));
        }
    }
}

#[test]
fn tampering_is_caught_on_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = ArtifactStore::new(local::LocalArtifacts::open(dir.path()).unwrap());
    let m = store.write(meta(Encoding::Bytes), bytes(b"0123456789")).unwrap();
    let blob = dir.path().join(format!("artifacts/blobs/{}.bin", m.artifact_id));
    let manifest = dir.path().join(format!("artifacts/{}.json", m.artifact_id));

    let mut flipped = fs::read(&blob).unwrap();
    flipped[3] ^= 0x01;
    fs::write(&blob, &flipped).unwrap();
    assert_eq!(store.read(&m.artifact_id).unwrap_err().code(), "ARTIFACT_HASH_MISMATCH");
    // Writing it again heals it with the right bytes.
    store.write(meta(Encoding::Bytes), bytes(b"0123456789")).unwrap();
    assert!(store.read(&m.artifact_id).is_ok());

    let text = fs::read_to_string(&manifest).unwrap();
    fs::write(&manifest, text.replace("\"sizeBytes\":10", "\"sizeBytes\":11")).unwrap();
    assert_eq!(
        store.read(&m.artifact_id).unwrap_err().code(),
        "ARTIFACT_MANIFEST_CORRUPT"
    );
    fs::write(&manifest, &text[..text.len() / 2]).unwrap();
    assert_eq!(
        store.read(&m.artifact_id).unwrap_err().code(),
        "ARTIFACT_MANIFEST_CORRUPT"
    );
    fs::write(&manifest, &text).unwrap();
    fs::remove_file(&blob).unwrap();
    assert_eq!(store.read(&m.artifact_id).unwrap_err().code(), "RUNTIME_INTEGRITY");
    assert_eq!(
        store.read("art_0000000000000000").unwrap_err().code(),
        "ARTIFACT_NOT_FOUND"
    );
}

#[test]
fn stale_temporary_files_are_removed_and_live_ones_kept() {
    let dir = tempfile::tempdir().unwrap();
    ArtifactStore::new(local::LocalArtifacts::open(dir.path()).unwrap());
    let blobs = dir.path().join("artifacts/blobs");
    // pid 2^31-2 does not exist; our own pid does.
    fs::write(blobs.join("incoming.2147483646.0-1.tmp"), b"partial").unwrap();
    fs::write(
        dir.path().join("artifacts/art_0000000000000001.2147483646.3-4.tmp"),
        b"{",
    )
    .unwrap();
    let mine = blobs.join(format!("incoming.{}.9-9.tmp", std::process::id()));
    fs::write(&mine, b"in progress").unwrap();
    let store = ArtifactStore::new(local::LocalArtifacts::open(dir.path()).unwrap());
    assert!(!blobs.join("incoming.2147483646.0-1.tmp").exists());
    assert!(!dir
        .path()
        .join("artifacts/art_0000000000000001.2147483646.3-4.tmp")
        .exists());
    assert!(mine.exists());
    assert!(store.list().unwrap().is_empty());
}

#[test]
fn concurrent_writers_of_one_artifact_end_with_one_intact_artifact() {
    let dir = tempfile::tempdir().unwrap();
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let stores: Vec<Arc<ArtifactStore>> = (0..2)
        .map(|_| Arc::new(ArtifactStore::new(local::LocalArtifacts::open(dir.path()).unwrap())))
        .collect();
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let store = stores[i % 2].clone();
            let payload = payload.clone();
            std::thread::spawn(move || store.write(meta(Encoding::Bytes), Data::Bytes(payload)).unwrap())
        })
        .collect();
    let manifests: Vec<Manifest> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(
        manifests.windows(2).all(|w| w[0] == w[1]),
        "every writer returns the one published manifest"
    );
    let (_, data) = stores[0].read(&manifests[0].artifact_id).unwrap();
    assert_eq!(*data, payload);
    let leftovers: Vec<_> = fs::read_dir(dir.path().join("artifacts/blobs"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty());
}

#[test]
fn bad_inputs_are_refused() {
    let store = ArtifactStore::new(r#virtual::VirtualArtifacts::new());
    let mut m = meta(Encoding::Utf8);
    m.name = String::new();
    assert_eq!(
        store.write(m, Data::Text("x".into())).unwrap_err().code(),
        "EVENT_VALIDATION"
    );
    let mut m = meta(Encoding::Utf8);
    m.run_id = "nope".into();
    assert_eq!(store.write(m, Data::Text("x".into())).unwrap_err().code(), "WORLD_PATH");
    assert_eq!(
        store
            .write(meta(Encoding::Bytes), Data::Text("x".into()))
            .unwrap_err()
            .code(),
        "EVENT_VALIDATION"
    );
    assert_eq!(
        store
            .write(meta(Encoding::Json), Data::Text("{".into()))
            .unwrap_err()
            .code(),
        "EVENT_VALIDATION"
    );
    assert!(parse_ref("artifact://art_0123456789abcdef").is_ok());
    assert!(parse_ref("art_0123456789abcdef").is_ok());
    assert!(parse_ref("artifact://art_xyz").is_err());
}

#[test]
fn directories_are_created_with_their_parents_and_a_file_in_the_way_is_an_error() {
    let root = tempfile::tempdir().unwrap();
    let deep = root.path().join("a/b/c");
    create_dir_synced(&deep, "a test directory").unwrap();
    assert!(deep.is_dir());
    // Again: nothing to do.
    create_dir_synced(&deep, "a test directory").unwrap();
    let file = root.path().join("a/file");
    std::fs::write(&file, b"x").unwrap();
    let err = create_dir_synced(&file.join("d"), "a test directory").unwrap_err();
    assert_eq!(err.code(), "WORLD_PATH");
    assert_eq!(
        err.to_string(),
        format!(
            "cannot create a test directory {}: {} is not a directory",
            file.join("d").display(),
            file.display()
        )
    );
    let err = create_dir_synced(&file, "a test directory").unwrap_err();
    assert_eq!(err.code(), "WORLD_PATH");
}

#[test]
fn a_file_system_error_names_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("gone");
    let err = WorldError::io(
        "reading a blob",
        Some(gone.clone()),
        std::io::ErrorKind::NotFound.into(),
    );
    assert_eq!(
        err.to_string(),
        format!("reading a blob {}: entity not found", gone.display())
    );
    let err = WorldError::io("starting a thread", None, std::io::ErrorKind::Other.into());
    assert_eq!(err.to_string(), "starting a thread: other error");
}

/// A FIFO where a blob or manifest belongs hung the read (and the world's close behind it); a
/// directory, a FIFO or a symbolic link to nothing is now corrupt and named, and a write of the
/// artifact puts a file back where it can.
#[test]
fn what_is_no_file_where_a_blob_or_manifest_belongs_is_corrupt_and_a_write_repairs_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = ArtifactStore::new(local::LocalArtifacts::open(dir.path()).unwrap());
    let mkfifo = |p: &Path| {
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string naming a path in a temporary directory.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    };
    let cases: [(&str, &str, &dyn Fn(&Path)); 5] = [
        ("blob", "a FIFO", &mkfifo),
        ("blob", "a directory", &|p| fs::create_dir(p).unwrap()),
        ("manifest", "a FIFO", &mkfifo),
        ("manifest", "a directory", &|p| fs::create_dir(p).unwrap()),
        ("manifest", "a symbolic link to nothing", &|p| {
            std::os::unix::fs::symlink(p.with_extension("nowhere"), p).unwrap()
        }),
    ];
    for (i, (file, what, make)) in cases.into_iter().enumerate() {
        let payload = format!("payload {i}");
        let m = store.write(meta(Encoding::Bytes), bytes(payload.as_bytes())).unwrap();
        let path = match file {
            "blob" => dir.path().join(format!("artifacts/blobs/{}.bin", m.artifact_id)),
            _ => dir.path().join(format!("artifacts/{}.json", m.artifact_id)),
        };
        fs::remove_file(&path).unwrap();
        make(&path);
        let err = store.read(&m.artifact_id).unwrap_err();
        assert_eq!(err.code(), "ARTIFACT_MANIFEST_CORRUPT", "{file} {what}: {err}");
        assert!(
            err.to_string()
                .contains(&format!("{} is {what}, not a file", path.display())),
            "{err}"
        );
        let rewritten = store.write(meta(Encoding::Bytes), bytes(payload.as_bytes()));
        if what == "a directory" {
            // Nothing is renamed over a directory; the error names it.
            let err = rewritten.unwrap_err();
            assert_eq!(err.code(), "WORLD_IO", "{file}: {err}");
            assert!(err.to_string().contains(&path.display().to_string()), "{err}");
        } else {
            rewritten.unwrap();
            assert_eq!(
                &*store.read(&m.artifact_id).unwrap().1,
                payload.as_bytes(),
                "{file} {what}"
            );
        }
    }
}

/// An artifact the system will not let be read is one problem among the others, not the end of
/// verify (a blob of mode 000 hid a damaged blob beside it).
#[test]
fn verify_reports_an_unreadable_artifact_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let store = ArtifactStore::new(local::LocalArtifacts::open(dir.path()).unwrap());
    let blob = |m: &Manifest| dir.path().join(format!("artifacts/blobs/{}.bin", m.artifact_id));
    let a = store.write(meta(Encoding::Bytes), bytes(b"aaaa")).unwrap();
    let b = store.write(meta(Encoding::Bytes), bytes(b"bbbb")).unwrap();
    // A symlink loop: unreadable for root too, where mode 000 is not.
    fs::remove_file(blob(&a)).unwrap();
    std::os::unix::fs::symlink(blob(&a), blob(&a)).unwrap();
    fs::write(blob(&b), b"BBBB").unwrap();
    let reader = crate::store::r#virtual::VirtualLog::new();
    let report = crate::verify::verify(
        &reader,
        &store,
        &crate::vocabulary::testing::Counting(10_000),
        None,
        false,
    )
    .unwrap();
    let mut kinds: Vec<(&str, String)> = report
        .problems
        .iter()
        .map(|p| (p.kind, p.artifact_id.clone().unwrap()))
        .collect();
    kinds.sort();
    let mut expected = vec![
        ("artifact-hash", b.artifact_id.clone()),
        ("artifact-unreadable", a.artifact_id.clone()),
    ];
    expected.sort();
    assert_eq!(kinds, expected);
    assert!(!report.ok);
}

/// An error of the machine (out of file descriptors, memory) ends verify as its own error; one of
/// the artifact (permissions, a symlink loop, I/O) is the artifact's problem. Counted as the
/// artifact's, "too many open files" read as damage that a second run did not find.
#[test]
fn verify_ends_on_an_error_of_the_machine_and_reports_one_of_the_artifact() {
    use crate::verify::artifact_problem;
    let io = |errno| WorldError::io("opening a blob", None, std::io::Error::from_raw_os_error(errno));
    for errno in [libc::EMFILE, libc::ENFILE, libc::ENOMEM, libc::EINTR] {
        let err = artifact_problem(&io(errno)).unwrap_err();
        assert_eq!(err.code(), "WORLD_IO");
    }
    for errno in [libc::EACCES, libc::ELOOP, libc::EIO] {
        assert_eq!(artifact_problem(&io(errno)).unwrap(), Some("artifact-unreadable"));
    }
    assert_eq!(artifact_problem(&not_found("art_x")).unwrap(), None);
}
