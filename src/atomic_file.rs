//! Files written whole or not at all: the bytes go to a temporary file beside the
//! target, synced, then renamed over it, so a failed or killed write never leaves a
//! partial file under the target's name, and the file it replaces stays intact until
//! the new one is complete. Traces, tensor records and parameter dicts are saved
//! this way.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `path` through `write`, which gets a fresh temporary file beside it
/// (`.{name}.{pid}-{n}.{host}.tmp`, see [`host_tag`]); on success the file is synced
/// and renamed over `path`. On any error the temporary file is removed (best effort)
/// and `path` is left as it was. Temporaries that killed saves of `path` on this host
/// left are removed first ([`remove_stale_temporaries`]).
///
/// What `path` names is kept: a symbolic link is followed (the file it names is
/// replaced, beside itself, and the link stays), a file replaced keeps its
/// permissions, and a target that is no regular file (a device such as `/dev/null`, a
/// FIFO) is written in place, as a plain write would (a rename would put a regular
/// file in its place).
pub(crate) fn write_atomic(
    path: &Path,
    write: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let resolved;
    let (path, permissions) = match std::fs::metadata(path) {
        Ok(status) if !status.is_file() && !status.is_dir() => {
            let mut file = std::fs::OpenOptions::new().write(true).open(path)?;
            return write(&mut file);
        }
        Ok(status) => {
            resolved = std::fs::canonicalize(path)?;
            (resolved.as_path(), Some(status.permissions()))
        }
        Err(_) => (path, None),
    };
    // A name of its own per save, so that saves of one path from several threads or
    // processes never write into one temporary file.
    static SAVES: AtomicU64 = AtomicU64::new(0);
    let save = SAVES.fetch_add(1, Ordering::Relaxed);
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let host = host_tag();
    remove_stale_temporaries(path, &host);
    let stem = temporary_stem(&name, &host);
    let temporary =
        path.with_file_name(format!(".{stem}.{}-{save}.{host}.tmp", std::process::id()));
    let written = File::create(&temporary).and_then(|mut file| {
        if let Some(permissions) = permissions {
            file.set_permissions(permissions)?;
        }
        write(&mut file)?;
        file.sync_all()
    });
    match written.and_then(|()| std::fs::rename(&temporary, path)) {
        Ok(()) => Ok(()),
        Err(error) => {
            // Best effort: the error that matters is the write's.
            let _ = std::fs::remove_file(&temporary);
            Err(error)
        }
    }
}

/// Removes the temporary files that saves of `path` by processes no longer running
/// left beside it (a save killed before its rename: `.{name}.{pid}-{n}.{host}.tmp`),
/// so a killed write costs its disk space only until the next save of the same path.
/// A file is removed only when it is `host`'s (this host's, [`host_tag`]) and its
/// process is gone (on Linux, no `/proc/{pid}`). Saves of this process, of any
/// process still running, and of other hosts are left alone: on a folder several
/// machines share, a pid says nothing about another machine's processes, and
/// removing a save in progress there made its rename fail. A temporary named without
/// a host (written before hosts were named) is left alone too, and where processes
/// cannot be looked up nothing is removed. Best effort: a save goes on whatever this
/// finds.
fn remove_stale_temporaries(path: &Path, host: &str) {
    let Some(name) = path.file_name().map(|name| name.to_string_lossy()) else {
        return;
    };
    let folder = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let Ok(entries) = std::fs::read_dir(folder) else {
        return;
    };
    let prefix = format!(".{}.", temporary_stem(&name, host));
    let own = std::process::id();
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(rest) = file_name
            .to_str()
            .and_then(|file| file.strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.strip_suffix(".tmp"))
        else {
            continue;
        };
        // The pid and count are digits, so the first dot ends them.
        let Some((pid, save)) = rest
            .split_once('.')
            .filter(|(_, of)| *of == host)
            .and_then(|(save, _)| save.split_once('-'))
        else {
            continue;
        };
        let (Ok(pid), true) = (pid.parse::<u32>(), save.bytes().all(|b| b.is_ascii_digit())) else {
            continue;
        };
        if pid != own && process_is_gone(pid) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The most bytes of a file name (on Linux's and macOS's file systems).
const NAME_MAX: usize = 255;

/// The part of a temporary's name (`.{stem}.{pid}-{n}.{host}.tmp`) that stands for the
/// file `name`: `name` itself, or, where a temporary of the longest pid (10 digits) and
/// count (20) would pass [`NAME_MAX`] bytes, its first characters that fit, so that a
/// file of any legal name can be saved (its temporary would otherwise be refused as
/// too long). Python's writes cut a name the same way (`cubepool._files.
/// temporary_stem`), so that a save finds what killed writes of either left. Two long
/// names that share their first characters share a stem: a save of one may remove
/// the other's temporaries, but only those whose process is gone.
fn temporary_stem<'a>(name: &'a str, host: &str) -> &'a str {
    let fixed = format!("..{}-{}.{host}.tmp", u32::MAX, u64::MAX).len();
    let mut end = NAME_MAX.saturating_sub(fixed);
    if name.len() <= end {
        return name;
    }
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// This host's name as it goes into a temporary file's name: the kernel's host name
/// (`uname`'s node name, which Python's `os.uname().nodename` gives too, so that the
/// temporaries of `cubepool._files` carry the same) with every character but ASCII
/// letters, digits, `-` and `_` replaced by `_` (a node name may hold a `/` or a
/// dot); empty where it cannot be read.
pub(crate) fn host_tag() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    name.trim_end_matches('\n')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Whether no process `pid` runs now (false where that cannot be told).
fn process_is_gone(pid: u32) -> bool {
    cfg!(target_os = "linux")
        && Path::new("/proc/self").exists()
        && !Path::new(&format!("/proc/{pid}")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    /// A fresh folder of its own under the temporary folder.
    fn folder(name: &str) -> std::path::PathBuf {
        let folder =
            std::env::temp_dir().join(format!("cubepool-atomic-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&folder);
        std::fs::create_dir_all(&folder).unwrap();
        folder
    }

    /// The names in `folder`.
    fn names(folder: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(folder)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_file_of_a_long_legal_name_is_written_and_its_stale_temporaries_removed() {
        let folder = folder("long");
        let name = format!("{}.bin", "é".repeat(120)); // 244 bytes, a legal name
        let path = folder.join(&name);
        let host = host_tag();
        let stem = temporary_stem(&name, &host);
        assert!(stem.len() < name.len() && name.starts_with(stem));
        let stale = format!(".{stem}.{}-0.{host}.tmp", u32::MAX);
        if cfg!(target_os = "linux") {
            std::fs::write(folder.join(&stale), b"killed").unwrap();
        }
        write_atomic(&path, |file| file.write_all(b"bytes")).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"bytes");
        assert_eq!(
            names(&folder),
            [name],
            "no temporary is left, the stale one neither"
        );
        // A short name is its own stem.
        assert_eq!(temporary_stem("out.bin", &host), "out.bin");
        std::fs::remove_dir_all(&folder).unwrap();
    }

    #[test]
    fn a_write_replaces_the_file_whole() {
        let folder = folder("whole");
        let path = folder.join("out.bin");
        std::fs::write(&path, b"old").unwrap();
        write_atomic(&path, |file| {
            file.write_all(b"new ")?;
            file.write_all(b"bytes")
        })
        .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new bytes");
        assert_eq!(names(&folder), ["out.bin"], "no temporary is left");
        std::fs::remove_dir_all(&folder).unwrap();
    }

    #[test]
    #[cfg(unix)]
    fn a_link_is_followed_and_a_file_keeps_its_permissions() {
        use std::os::unix::fs::PermissionsExt as _;
        let folder = folder("kept");
        let real = folder.join("real.bin");
        std::fs::write(&real, b"old").unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = folder.join("link.bin");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        write_atomic(&link, |file| file.write_all(b"new")).unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&real).unwrap(), b"new");
        let mode = std::fs::metadata(&real).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "a private file stays private");
        assert_eq!(
            names(&folder),
            ["link.bin", "real.bin"],
            "no temporary is left"
        );
        std::fs::remove_dir_all(&folder).unwrap();
    }

    #[test]
    #[cfg(unix)]
    fn a_device_is_written_in_place_not_replaced() {
        let null = Path::new("/dev/null");
        write_atomic(null, |file| file.write_all(b"gone")).unwrap();
        assert!(
            !std::fs::metadata(null).unwrap().is_file(),
            "still a device"
        );
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_temporary() {
        let folder = folder("failed");
        let path = folder.join("out.bin");
        std::fs::write(&path, b"old").unwrap();
        let error = write_atomic(&path, |file| {
            file.write_all(b"half")?;
            Err(io::Error::other("the disk is full"))
        })
        .unwrap_err();
        assert_eq!(error.to_string(), "the disk is full");
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(names(&folder), ["out.bin"], "no temporary is left");
        std::fs::remove_dir_all(&folder).unwrap();
    }
}
