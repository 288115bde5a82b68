//! `@little-workflow/world`: the durable storage layer of a TypeScript workflow runtime.
//!
//! [`core`] holds every rule and all storage, with no napi anywhere in it; [`napi`] only converts
//! values and wraps core calls for JavaScript.

#![deny(clippy::all)]

pub mod core;
// napi-derive registers the exports only outside `cargo test`.
#[cfg_attr(test, allow(dead_code))]
mod napi;

/// Rust's allocations in this library (not Node's) come from mimalloc: appends allocate on one
/// thread and free on another, which glibc's arenas handle with locks and consolidation passes.
/// Built without transparent huge pages (see the test below).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(all(test, target_os = "linux"))]
mod tests {
    /// The `VmFlags` of the mapping holding `addr`, from `/proc/self/smaps`.
    fn vm_flags_at(addr: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("reading /proc/self/smaps");
        let mut inside = false;
        for line in smaps.lines() {
            let range = line.split_whitespace().next().and_then(|r| r.split_once('-'));
            if let Some((Ok(start), Ok(end))) =
                range.map(|(s, e)| (usize::from_str_radix(s, 16), usize::from_str_radix(e, 16)))
            {
                inside = (start..end).contains(&addr);
            } else if inside && line.starts_with("VmFlags:") {
                return line.to_string();
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    /// mimalloc asks for transparent huge pages on the memory it maps (`MADV_HUGEPAGE`) unless
    /// built without (`no_thp`). Where the system honours that advice only (the `madvise`
    /// setting, as on the development machine), a fault in such memory clears 2 MiB at once and
    /// may first compact memory to find it: copying appends' long strings in on the JavaScript
    /// thread took 119-157 ms of its CPU for 1,000 64 KiB appends in some runs, 57-72 ms in others.
    #[test]
    fn the_allocator_does_not_ask_for_huge_pages() {
        let sizes = [64 * 1024, 1024 * 1024, 64 * 1024 * 1024];
        let buffers: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![1u8; n]).collect();
        for b in &buffers {
            let flags = vm_flags_at(b.as_ptr() as usize);
            assert!(
                !flags.split_whitespace().any(|f| f == "hg"),
                "{} bytes were allocated in memory advised for huge pages: {flags}",
                b.len()
            );
        }
    }
}
