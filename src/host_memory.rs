//! How much memory this process can take from the host now: the least of Linux's
//! `MemAvailable` and the room left under each memory limit of the control groups
//! the process is in.
//!
//! `MemAvailable` is the whole machine's: in a container with a memory limit it
//! counts memory the process may not take, and past its group's limit the kernel
//! reclaims and then kills the process, as it does past the machine's memory. So
//! each limit on the path from the process's group up to the root its mount shows is
//! read too (a parent's limit binds its children): cgroup v2's `memory.max` less
//! `memory.current`, v1's `memory.limit_in_bytes` less `memory.usage_in_bytes`, each
//! use less the group's inactive file cache (v2 `inactive_file`, v1
//! `total_inactive_file` of `memory.stat`), which the kernel takes back before it
//! kills (the "working set" container runtimes count, as `MemAvailable` counts such
//! cache available). A level whose files are missing or say `max` sets no bound.
//! Where nothing can be read (another system, no `/proc`) the answer is `None`: not
//! known.
//!
//! The groups are found where `/proc/self/mountinfo` says their hierarchy is mounted
//! (a v2 `cgroup2` mount; a v1 `cgroup` mount with the `memory` controller), the
//! process's group path taken relative to the mount's root: a container may see its
//! own group as the root of its mount, or a bind mount of a subtree. Limits above
//! what the mount shows cannot be read and are not counted.
//!
//! A rough guard for host allocations the kernel would let through (overcommit) and
//! then kill the process for while they are written; it reserves nothing, and what
//! other processes take after it was read is not counted.

use std::fs;
use std::path::{Path, PathBuf};

/// The bytes this process can take from the host now, as the module doc says;
/// `None` where neither the host nor a control group says.
pub(crate) fn available() -> Option<u64> {
    available_under(Path::new("/proc"))
}

/// [`available`] with `/proc` at `proc` (the tests' own trees, whose `mountinfo`
/// names mount points in the tree).
fn available_under(proc: &Path) -> Option<u64> {
    let host = fs::read_to_string(proc.join("meminfo"))
        .ok()
        .and_then(|text| mem_available(&text));
    let groups = match (
        fs::read_to_string(proc.join("self/cgroup")),
        fs::read_to_string(proc.join("self/mountinfo")),
    ) {
        (Ok(cgroup), Ok(mountinfo)) => group_room(&cgroup, &mounts(&mountinfo)),
        _ => None,
    };
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

/// A mount of a control group hierarchy: the group its mount point shows, where it
/// is, and which hierarchy.
#[derive(Debug, PartialEq, Eq)]
struct Mount {
    /// The group at the mount point (`/` unless a subtree is mounted).
    root: String,
    point: PathBuf,
    kind: Hierarchy,
}

/// Which hierarchy a mount or a line of `/proc/self/cgroup` is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hierarchy {
    /// cgroup v2's unified hierarchy.
    Unified,
    /// A cgroup v1 hierarchy with the memory controller.
    V1Memory,
}

impl Hierarchy {
    /// The files of a group's limit, its use and its statistics, and the statistic of
    /// its inactive file cache.
    fn files(self) -> [&'static str; 4] {
        match self {
            Self::Unified => [
                "memory.max",
                "memory.current",
                "memory.stat",
                "inactive_file",
            ],
            Self::V1Memory => [
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                "memory.stat",
                "total_inactive_file",
            ],
        }
    }
}

/// The control group mounts of `/proc/self/mountinfo`'s text. A line is `id parent
/// major:minor root point options [optional...] - type source super-options`; paths
/// write a space, a tab, a newline and a backslash as octal escapes.
fn mounts(mountinfo: &str) -> Vec<Mount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let fields: Vec<&str> = before.split(' ').collect();
            let (root, point) = (fields.get(3)?, fields.get(4)?);
            let mut after = after.split(' ');
            let kind = match (after.next()?, after.nth(1)) {
                ("cgroup2", _) => Hierarchy::Unified,
                ("cgroup", Some(options)) if options.split(',').any(|o| o == "memory") => {
                    Hierarchy::V1Memory
                }
                _ => return None,
            };
            Some(Mount {
                root: unescape(root),
                point: PathBuf::from(unescape(point)),
                kind,
            })
        })
        .collect()
}

/// A path of `mountinfo` with its octal escapes (`\040`) read.
fn unescape(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let octal = bytes.get(at + 1..at + 4).filter(|digits| {
            bytes[at] == b'\\' && digits.iter().all(|d| (b'0'..=b'7').contains(d))
        });
        match octal {
            Some(digits) => {
                let value = digits.iter().fold(0u32, |v, d| v * 8 + u32::from(d - b'0'));
                out.push(value as u8);
                at += 4;
            }
            None => {
                out.push(bytes[at]);
                at += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The least room under the memory limits of the groups `/proc/self/cgroup`'s text
/// names, at each level from the group up to the root its mount shows; `None` where
/// no level has a limit that can be read.
///
/// Each line is `hierarchy:controllers:path`: cgroup v2's has no controllers
/// (`0::/path`), a v1 line of the memory controller names `memory` among them.
fn group_room(cgroup: &str, mounts: &[Mount]) -> Option<u64> {
    let mut least: Option<u64> = None;
    for line in cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let kind = if controllers.is_empty() {
            Hierarchy::Unified
        } else if controllers.split(',').any(|name| name == "memory") {
            Hierarchy::V1Memory
        } else {
            continue;
        };
        for mount in mounts.iter().filter(|mount| mount.kind == kind) {
            // The group's path below the mount's root; a group outside what the mount
            // shows (another namespace's view) is read from the mount's root alone.
            let below = path
                .strip_prefix(mount.root.trim_end_matches('/'))
                .filter(|rest| rest.is_empty() || rest.starts_with('/'))
                .unwrap_or("");
            // The group's own level first, then each parent up to the mount point.
            let mut level = Some(below.trim_matches('/'));
            while let Some(relative) = level {
                if let Some(room) = room_in(&mount.point.join(relative), kind) {
                    least = Some(least.map_or(room, |least| least.min(room)));
                }
                level = (!relative.is_empty()).then(|| match relative.rfind('/') {
                    Some(slash) => &relative[..slash],
                    None => "",
                });
            }
        }
    }
    least
}

/// The room under the limit of the group at `dir`, less its use (its inactive file
/// cache not counted); `None` where the limit or the use is missing or unreadable,
/// or the limit is `max`.
fn room_in(dir: &Path, kind: Hierarchy) -> Option<u64> {
    let [limit_file, usage_file, stat_file, inactive_key] = kind.files();
    let read = |file: &str| -> Option<u64> {
        fs::read_to_string(dir.join(file)).ok()?.trim().parse().ok()
    };
    let inactive = fs::read_to_string(dir.join(stat_file))
        .ok()
        .and_then(|stat| {
            stat.lines().find_map(|line| {
                let (key, value) = line.split_once(' ')?;
                (key == inactive_key).then(|| value.trim().parse().ok())?
            })
        })
        .unwrap_or(0);
    let used = read(usage_file)?.saturating_sub(inactive);
    Some(read(limit_file)?.saturating_sub(used))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory of the test's own, removed at the end: its `proc/` stands for
    /// `/proc`, and its `mountinfo` names mount points inside it.
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

        /// Mounts (in `proc/self/mountinfo`) a hierarchy of `kind` (`cgroup2`, or
        /// `cgroup` with `options`) showing group `root` at `point` of the tree.
        fn mount(&self, root: &str, point: &str, kind: &str, options: &str) {
            let path = self.0.join("proc/self/mountinfo");
            let mut text = fs::read_to_string(&path).unwrap_or_default();
            let point = self
                .0
                .join(point)
                .display()
                .to_string()
                .replace(' ', "\\040");
            text.push_str(&format!(
                "40 31 0:38 {root} {point} rw,relatime shared:9 - {kind} {kind} {options}\n"
            ));
            self.write("proc/self/mountinfo", &text);
        }

        fn available(&self) -> Option<u64> {
            available_under(&self.0.join("proc"))
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
        tree.write("proc/self/cgroup", "0::/\n");
        tree.mount("/", "cgroup", "cgroup2", "rw");
        assert_eq!(
            tree.available(),
            Some(2_048_000 * 1024),
            "a root without limits"
        );
        assert_eq!(mem_available("MemFree: 4 kB\n"), None);
    }

    /// A cgroup v2 limit below the host's available memory bounds the answer by the
    /// room under it, its inactive file cache counted as room; a parent's tighter
    /// limit binds the child; `max` sets no bound.
    #[test]
    fn a_v2_group_limit_and_its_parents_bound_the_answer() {
        let tree = Tree::new("v2");
        tree.write("proc/meminfo", MEMINFO);
        tree.write("proc/self/cgroup", "0::/jobs/mine\n");
        tree.mount("/", "cgroup", "cgroup2", "rw,nsdelegate");
        tree.write("cgroup/jobs/mine/memory.max", "max\n");
        tree.write("cgroup/jobs/mine/memory.current", "100\n");
        assert_eq!(tree.available(), Some(2_048_000 * 1024), "max is no bound");
        tree.write("cgroup/jobs/mine/memory.max", "1000000\n");
        assert_eq!(tree.available(), Some(1_000_000 - 100));
        tree.write("cgroup/jobs/mine/memory.current", "900100\n");
        tree.write(
            "cgroup/jobs/mine/memory.stat",
            "anon 100\nfile 900000\nactive_file 100000\ninactive_file 800000\n",
        );
        assert_eq!(tree.available(), Some(899_900), "inactive cache is room");
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

    /// A cgroup v1 memory controller's limit is read where its hierarchy is mounted;
    /// a line of another controller is passed over, though a memory group of its
    /// path would bound the answer.
    #[test]
    fn a_v1_memory_group_limit_bounds_the_answer() {
        let tree = Tree::new("v1");
        tree.write("proc/meminfo", MEMINFO);
        tree.write(
            "proc/self/cgroup",
            "5:cpu,cpuacct:/other\n4:memory:/box/1\n0::/\n",
        );
        tree.mount("/", "sys fs/cpu", "cgroup", "rw,cpu,cpuacct");
        tree.mount("/", "sys fs/memory", "cgroup", "rw,memory");
        tree.write("sys fs/memory/box/1/memory.limit_in_bytes", "4096000\n");
        tree.write("sys fs/memory/box/1/memory.usage_in_bytes", "296000\n");
        tree.write(
            "sys fs/memory/box/1/memory.stat",
            "cache 250000\ninactive_file 1\ntotal_inactive_file 200000\n",
        );
        tree.write("sys fs/memory/other/memory.limit_in_bytes", "1\n");
        tree.write("sys fs/memory/other/memory.usage_in_bytes", "0\n");
        assert_eq!(tree.available(), Some(4_000_000));
    }

    /// A mount of a subtree (a container's view without a cgroup namespace) shows the
    /// process's group below the mount's root: its own limit and those up to the
    /// mount point are read; a group outside the mount's view is read at its root.
    #[test]
    fn a_mounted_subtree_is_walked_from_the_group_to_the_mount_point() {
        let tree = Tree::new("subtree");
        tree.write("proc/self/cgroup", "4:memory:/docker/abc/job\n");
        tree.mount("/docker/abc", "memory", "cgroup", "rw,memory");
        tree.write("memory/memory.limit_in_bytes", "4000000000\n");
        tree.write("memory/memory.usage_in_bytes", "0\n");
        tree.write("memory/job/memory.limit_in_bytes", "1000000\n");
        tree.write("memory/job/memory.usage_in_bytes", "1000\n");
        assert_eq!(tree.available(), Some(999_000), "the job's own limit");
        tree.write("proc/self/cgroup", "4:memory:/docker/abcdef\n");
        assert_eq!(tree.available(), Some(4_000_000_000), "outside: the root's");
    }

    /// A group whose files cannot be read sets no bound, and with no host figure
    /// either nothing is known.
    #[test]
    fn unreadable_groups_set_no_bound() {
        let tree = Tree::new("none");
        assert_eq!(tree.available(), None);
        tree.write("proc/self/cgroup", "0::/gone\nnot a line\n");
        assert_eq!(tree.available(), None, "no mountinfo");
        tree.mount("/", "cgroup", "cgroup2", "rw");
        tree.write("cgroup/gone/memory.max", "4096\n");
        assert_eq!(tree.available(), None, "no use read, no room known");
        tree.write("cgroup/gone/memory.current", "1024\n");
        assert_eq!(tree.available(), Some(3072), "a group's room alone");
        tree.write("cgroup/gone/memory.stat", "inactive_file lots\n");
        assert_eq!(tree.available(), Some(3072), "an unreadable statistic is 0");
    }

    /// `mountinfo` writes a space in a path as `\040`; other text is kept.
    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape(r"/sys\040fs/a\134b\09"), "/sys fs/a\\b\\09");
        let line = r"35 31 0:32 / /sys\040fs/memory rw - cgroup cgroup rw,memory";
        let found = mounts(line);
        assert_eq!(
            found,
            vec![Mount {
                root: "/".into(),
                point: PathBuf::from("/sys fs/memory"),
                kind: Hierarchy::V1Memory,
            }]
        );
        assert!(mounts("31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw").is_empty());
    }
}
