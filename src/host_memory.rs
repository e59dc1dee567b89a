//! How much memory this process can take from the host now: the least of Linux's
//! `MemAvailable` and the room left under each memory limit of the control groups
//! the process is in.
//!
//! `MemAvailable` is the whole machine's: in a container with a memory limit it
//! counts memory the process may not take, and past its group's limit the kernel
//! reclaims and then kills the process, as it does past the machine's memory. So
//! each limit on the path from the process's group up to the hierarchy's root is
//! read too (a parent's limit binds its children): cgroup v2's `memory.max` less
//! `memory.current`, v1's `memory.limit_in_bytes` less `memory.usage_in_bytes`. A
//! level whose files are missing or say `max` sets no bound. Where nothing can be
//! read (another system, no `/proc`) the answer is `None`: not known.
//!
//! A rough guard for host allocations the kernel would let through (overcommit) and
//! then kill the process for while they are written; it reserves nothing, and what
//! other processes take after it was read is not counted.

use std::fs;
use std::path::Path;

/// The bytes this process can take from the host now, as the module doc says;
/// `None` where neither the host nor a control group says.
pub(crate) fn available() -> Option<u64> {
    available_under(Path::new("/proc"), Path::new("/sys/fs/cgroup"))
}

/// [`available`] with `/proc` at `proc` and the control groups' file systems at
/// `cgroups` (the tests' own trees).
fn available_under(proc: &Path, cgroups: &Path) -> Option<u64> {
    let host = fs::read_to_string(proc.join("meminfo"))
        .ok()
        .and_then(|text| mem_available(&text));
    let groups = fs::read_to_string(proc.join("self/cgroup"))
        .ok()
        .and_then(|text| group_room(&text, cgroups));
    match (host, groups) {
        (Some(host), Some(groups)) => Some(host.min(groups)),
        (host, groups) => host.or(groups),
    }
}

/// `MemAvailable` of `/proc/meminfo`'s text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let kib: u64 = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// The least room under the memory limits of the groups `/proc/self/cgroup`'s text
/// names, at each level from the group up to the root of its hierarchy; `None`
/// where no level has a limit that can be read.
///
/// Each line is `hierarchy:controllers:path`. cgroup v2's one line has no
/// controllers (`0::/path`) and its files lie under `cgroups/path`; a v1 line whose
/// controllers include `memory` has them under `cgroups/memory/path`.
fn group_room(cgroup: &str, cgroups: &Path) -> Option<u64> {
    let mut least: Option<u64> = None;
    for line in cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (root, limit_file, usage_file) = if controllers.is_empty() {
            (cgroups.to_path_buf(), "memory.max", "memory.current")
        } else if controllers.split(',').any(|name| name == "memory") {
            (
                cgroups.join("memory"),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        } else {
            continue;
        };
        // The group's own level first, then each parent up to the root (`""`).
        let mut level = Some(path.trim_start_matches('/'));
        while let Some(relative) = level {
            let dir = root.join(relative);
            if let Some(room) = room_in(&dir, limit_file, usage_file) {
                least = Some(least.map_or(room, |least| least.min(room)));
            }
            level = (!relative.is_empty()).then(|| match relative.rfind('/') {
                Some(slash) => &relative[..slash],
                None => "",
            });
        }
    }
    least
}

/// The room under the limit in `dir/limit_file`, less the use in `dir/usage_file`;
/// `None` where either is missing or unreadable, or the limit is `max`.
fn room_in(dir: &Path, limit_file: &str, usage_file: &str) -> Option<u64> {
    let read = |file: &str| -> Option<u64> {
        fs::read_to_string(dir.join(file)).ok()?.trim().parse().ok()
    };
    Some(read(limit_file)?.saturating_sub(read(usage_file)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A fresh directory of the test's own, removed at the end.
    struct Tree(PathBuf);

    impl Tree {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!(
                "cubepool-host-memory-{name}-{}",
                std::process::id()
            ));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        fn write(&self, relative: &str, text: &str) {
            let path = self.0.join(relative);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        }

        fn available(&self) -> Option<u64> {
            available_under(&self.0.join("proc"), &self.0.join("cgroup"))
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    const MEMINFO: &str = "MemTotal:       24576000 kB\nMemFree:  1000 kB\n\
                           MemAvailable:   2048000 kB\nBuffers: 0 kB\n";

    /// Without control groups the answer is the host's `MemAvailable`, in bytes.
    #[test]
    fn the_host_alone_gives_mem_available() {
        let tree = Tree::new("host");
        tree.write("proc/meminfo", MEMINFO);
        assert_eq!(tree.available(), Some(2_048_000 * 1024));
        assert_eq!(mem_available("MemFree: 4 kB\n"), None);
    }

    /// A cgroup v2 limit below the host's available memory bounds the answer by the
    /// room under it; a parent's tighter limit binds the child; `max` sets no bound.
    #[test]
    fn a_v2_group_limit_and_its_parents_bound_the_answer() {
        let tree = Tree::new("v2");
        tree.write("proc/meminfo", MEMINFO);
        tree.write("proc/self/cgroup", "0::/jobs/mine\n");
        tree.write("cgroup/jobs/mine/memory.max", "max\n");
        tree.write("cgroup/jobs/mine/memory.current", "100\n");
        assert_eq!(tree.available(), Some(2_048_000 * 1024), "max is no bound");
        tree.write("cgroup/jobs/mine/memory.max", "1000000\n");
        assert_eq!(tree.available(), Some(1_000_000 - 100));
        tree.write("cgroup/jobs/memory.max", "500000\n");
        tree.write("cgroup/jobs/memory.current", "400000\n");
        assert_eq!(tree.available(), Some(100_000), "the parent's room is less");
        tree.write("cgroup/jobs/memory.current", "600000\n");
        assert_eq!(
            tree.available(),
            Some(0),
            "a group past its limit has no room"
        );
    }

    /// A cgroup v1 memory controller's limit is read from its own hierarchy; lines of
    /// other controllers are passed over.
    #[test]
    fn a_v1_memory_group_limit_bounds_the_answer() {
        let tree = Tree::new("v1");
        tree.write("proc/meminfo", MEMINFO);
        tree.write(
            "proc/self/cgroup",
            "5:cpu,cpuacct:/other\n4:memory:/box/1\n0::/\n",
        );
        tree.write("cgroup/memory/box/1/memory.limit_in_bytes", "4096000\n");
        tree.write("cgroup/memory/box/1/memory.usage_in_bytes", "96000\n");
        tree.write("cgroup/cpu,cpuacct/other/memory.limit_in_bytes", "1\n");
        assert_eq!(tree.available(), Some(4_000_000));
    }

    /// A group whose files cannot be read sets no bound, and with no host figure
    /// either nothing is known.
    #[test]
    fn unreadable_groups_set_no_bound() {
        let tree = Tree::new("none");
        assert_eq!(tree.available(), None);
        tree.write("proc/self/cgroup", "0::/gone\nnot a line\n");
        assert_eq!(tree.available(), None);
        tree.write("cgroup/gone/memory.max", "4096\n");
        assert_eq!(tree.available(), None, "no use read, no room known");
        tree.write("cgroup/gone/memory.current", "1024\n");
        assert_eq!(tree.available(), Some(3072), "a group's room alone");
    }
}
