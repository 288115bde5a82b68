//! Whether the process that wrote a record (a lock's owner) is still running.
//!
//! A pid alone cannot tell. Pids are reused, and a container restarted on the same data directory
//! often gets its old pid back (node as pid 1, or the same small number every start): the locks
//! its previous incarnation held then looked held by a live process, itself, and stayed locked
//! for as long as it ran. So a record also carries its writer's *incarnation* where the system
//! exposes one. On Linux that is `linux:<boot id>:<pid namespace>:<start time>`, the start time
//! being the process's in clock ticks since boot (`/proc/<pid>/stat`, field 22), which a reused
//! pid does not share.
//!
//! [`still_running`] judges a record:
//! - written in another boot: gone, whatever its pid is now;
//! - written in this boot and pid namespace: running if the pid exists and, where its start time
//!   can be read, it is the recorded one;
//! - written in another pid namespace (another container sharing the directory): its pid means
//!   nothing here, and the existence check is all there is, as for records without an
//!   incarnation (written by earlier versions, or on systems without `/proc`).

use std::sync::OnceLock;

/// Whether a process with this id exists (in this pid namespace).
pub fn alive(pid: u32) -> bool {
    #[cfg(unix)]
    {
        if pid == 0 || pid > i32::MAX as u32 {
            return false;
        }
        // SAFETY: signal 0 checks for existence and permission only.
        let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
    }
}

/// This process's incarnation, for the records it writes; `None` where the system has none.
pub fn incarnation() -> Option<&'static str> {
    static ME: OnceLock<Option<String>> = OnceLock::new();
    ME.get_or_init(|| {
        let me = Incarnation::of_self()?;
        Some(format!("linux:{}:{}:{}", me.boot, me.pid_ns, me.start))
    })
    .as_deref()
}

/// Whether the process that recorded `pid` and `incarnation` is still running (see the module).
pub fn still_running(pid: u32, incarnation: Option<&str>) -> bool {
    let (Some(recorded), Some(me)) = (incarnation.and_then(Incarnation::parse), Incarnation::mine()) else {
        return alive(pid);
    };
    if recorded.boot != me.boot {
        return false;
    }
    if recorded.pid_ns != me.pid_ns {
        return alive(pid);
    }
    // A process that ends between the two checks reads as running; the next look sees it gone.
    alive(pid) && start_time(&pid.to_string()).is_none_or(|start| start == recorded.start)
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Incarnation {
    boot: String,
    pid_ns: String,
    start: u64,
}

impl Incarnation {
    fn parse(text: &str) -> Option<Incarnation> {
        let mut parts = text.split(':');
        let (Some("linux"), Some(boot), Some(pid_ns), Some(start), None) =
            (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        Some(Incarnation {
            boot: boot.to_string(),
            pid_ns: pid_ns.to_string(),
            start: start.parse().ok()?,
        })
    }

    fn mine() -> Option<Incarnation> {
        incarnation().and_then(Incarnation::parse)
    }

    fn of_self() -> Option<Incarnation> {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let boot = boot.trim();
        // `pid:[4026531836]`: the namespace's inode, the same for every process in it.
        let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
        let ns = ns.to_str()?.strip_prefix("pid:[")?.strip_suffix(']')?;
        let fine = |s: &str| !s.is_empty() && !s.contains(':');
        if !fine(boot) || !fine(ns) {
            return None;
        }
        Some(Incarnation {
            boot: boot.to_string(),
            pid_ns: ns.to_string(),
            start: start_time("self")?,
        })
    }
}

/// Field 22 of `/proc/<pid>/stat`: when the process started, in clock ticks since boot. The
/// second field (the command name, in parentheses) may hold spaces and parentheses itself, so the
/// fields are counted from the last `)`.
fn start_time(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_start_time(&stat)
}

fn stat_start_time(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // After the name come field 3 (state) onwards, so field 22 is the 20th.
    after_name.split_ascii_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_is_counted_from_the_last_parenthesis() {
        let stat = "4242 (a) b (c) 1) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 987654 12345 10";
        assert_eq!(stat_start_time(stat), Some(987_654));
        assert_eq!(stat_start_time("4242 (node"), None);
    }

    #[test]
    fn only_the_linux_form_parses() {
        assert_eq!(
            Incarnation::parse("linux:b-1:4026531836:77"),
            Some(Incarnation {
                boot: "b-1".into(),
                pid_ns: "4026531836".into(),
                start: 77
            })
        );
        for bad in ["", "linux:b:1", "linux:b:1:x", "linux:b:1:2:3", "darwin:b:1:2"] {
            assert_eq!(Incarnation::parse(bad), None, "{bad}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_live_pid_with_another_start_time_is_not_the_recorded_process() {
        let me = Incarnation::mine().expect("Linux has an incarnation");
        let pid = std::process::id();
        let with = |boot: &str, ns: &str, start: u64| format!("linux:{boot}:{ns}:{start}");
        assert!(still_running(pid, incarnation()));
        assert!(still_running(pid, None), "no incarnation: the pid is all there is");
        // This pid, started at another time: an earlier process that had the same pid.
        assert!(!still_running(pid, Some(&with(&me.boot, &me.pid_ns, me.start + 1))));
        // Another boot: gone, even with this very pid and start time.
        assert!(!still_running(pid, Some(&with("another-boot", &me.pid_ns, me.start))));
        // Another pid namespace: only the pid's existence can be checked here.
        assert!(still_running(pid, Some(&with(&me.boot, "1", me.start + 1))));
        assert!(!still_running(0, Some(&with(&me.boot, "1", me.start))));
        // Unparseable: as if there were none.
        assert!(still_running(pid, Some("linux:?")));
    }
}
