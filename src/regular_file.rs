//! Opening a file that must be a regular one (a configuration file, a plan file): opened
//! without waiting, then looked at, then read without waiting.
//!
//! Opening a FIFO to read waits for a writer, so a path naming one (or one that became
//! one after it was checked) would hang its reader. The file is opened with
//! `O_NONBLOCK`, which a regular file's open ignores, and its kind read from the open
//! file (what is read is what was looked at). A file the kernel calls regular may still
//! be a stream that keeps a read waiting (`/proc/kmsg`, a tracing pipe): one with
//! nothing to read is refused at its open ([`WAITS`], asked with `poll`, which reads
//! nothing), and the flag is kept, so that one read to its end fails its next read with
//! `WouldBlock` ([`read_error`] says why) instead of waiting. A file on disk takes no
//! notice of the flag (Linux and macOS): its reads are as any file's. Python's
//! `cubepool._files.open_regular` does the same.
#![allow(unsafe_code)]

use std::fs::{File, Metadata};
use std::io;
use std::path::Path;

/// What `file_type` is, in words, where it is not a regular file.
fn not_regular(file_type: std::fs::FileType) -> Option<&'static str> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return Some("a FIFO");
        }
        if file_type.is_socket() {
            return Some("a socket");
        }
        if file_type.is_char_device() || file_type.is_block_device() {
            return Some("a device");
        }
    }
    if file_type.is_dir() {
        return Some("a folder");
    }
    (!file_type.is_file()).then_some("not a regular file")
}

/// What a file is, in words, that is regular by its kind but has nothing to read now and
/// would keep a read waiting for more.
pub(crate) const WAITS: &str = "a stream that would keep a read waiting";

/// Why [`open_regular`] gave no file.
#[derive(Debug)]
pub(crate) enum OpenRegularError {
    /// The open or a look at the open file failed.
    Io(io::Error),
    /// It is not a regular file: what it is, in words.
    NotRegular(&'static str),
}

/// `path` opened to read, with its metadata, where it is a regular file with something to
/// read (its reads do not wait: see the module's text).
pub(crate) fn open_regular(path: &Path) -> Result<(File, Metadata), OpenRegularError> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path).map_err(OpenRegularError::Io)?;
    let metadata = file.metadata().map_err(OpenRegularError::Io)?;
    if let Some(kind) = not_regular(metadata.file_type()) {
        return Err(OpenRegularError::NotRegular(kind));
    }
    #[cfg(unix)]
    if waits(&file).map_err(OpenRegularError::Io)? {
        return Err(OpenRegularError::NotRegular(WAITS));
    }
    Ok((file, metadata))
}

/// [`open_regular`] as one `io::Result`: a file that is not regular (or is a stream that
/// would keep a read waiting) is an `InvalidInput` error saying what it is, for readers
/// whose errors are I/O errors (a trace, a tensor file).
pub(crate) fn open_regular_file(path: &Path) -> io::Result<File> {
    match open_regular(path) {
        Ok((file, _)) => Ok(file),
        Err(OpenRegularError::Io(error)) => Err(error),
        Err(OpenRegularError::NotRegular(kind)) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{kind}, not a regular file"),
        )),
    }
}

/// Whether a read of `file` would wait: `poll` says it is not ready to read (a file on
/// disk always is, a stream of the kernel's only while it holds data).
#[cfg(unix)]
fn waits(file: &File) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    let mut poll = libc::pollfd {
        fd: file.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `poll` is one valid pollfd for the call, whose descriptor `file` owns for
    // its whole length; a timeout of 0 returns at once.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    if ready < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ready == 0)
}

/// The error of a read of a file [`open_regular`] opened: a read that would have waited
/// (a stream read to its end) says so in words, as its open would have.
pub(crate) fn read_error(error: io::Error) -> io::Error {
    if error.kind() == io::ErrorKind::WouldBlock {
        return io::Error::new(
            io::ErrorKind::WouldBlock,
            format!("{WAITS}, not a regular file"),
        );
    }
    error
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::FromRawFd;

    /// A pipe's reading end, opened without waiting as [`open_regular`] opens a file, and
    /// its writing end: a stand-in for a stream of the kernel's such as `/proc/kmsg`.
    fn stream() -> (File, File) {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe writes.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: pipe made both descriptors just now; each File is their one owner.
        let (reader, writer) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
        // SAFETY: F_SETFL sets the status flags of the descriptor `reader` owns.
        assert_eq!(
            unsafe { libc::fcntl(fds[0], libc::F_SETFL, libc::O_NONBLOCK) },
            0
        );
        (reader, writer)
    }

    #[test]
    fn a_stream_with_nothing_to_read_waits_and_a_file_on_disk_does_not() {
        let (reader, mut writer) = stream();
        assert!(waits(&reader).unwrap());
        writer.write_all(b"<6>kernel: a line\n").unwrap();
        assert!(!waits(&reader).unwrap());
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        let (file, metadata) = open_regular(&manifest).unwrap();
        assert!(metadata.is_file() && !waits(&file).unwrap());
    }

    #[test]
    fn a_stream_read_to_its_end_fails_its_next_read_saying_why() {
        // /proc/kmsg holding a line when opened: the read past it waited forever.
        let (mut reader, mut writer) = stream();
        writer.write_all(b"<6>kernel: a line\n").unwrap();
        let mut bytes = Vec::new();
        let error = read_error(reader.read_to_end(&mut bytes).unwrap_err());
        assert_eq!(error.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(error.to_string(), format!("{WAITS}, not a regular file"));
        assert_eq!(bytes, b"<6>kernel: a line\n");
        // Other errors pass as they are.
        let other = read_error(io::Error::from(io::ErrorKind::InvalidData));
        assert_eq!(other.kind(), io::ErrorKind::InvalidData);
    }
}
