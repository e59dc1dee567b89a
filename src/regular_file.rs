//! Opening a file that must be a regular one (a configuration file, a plan file): opened
//! without waiting, then looked at, then read as any file is.
//!
//! Opening a FIFO to read waits for a writer, so a path naming one (or one that became
//! one after it was checked) would hang its reader. The file is opened with
//! `O_NONBLOCK`, which a regular file's open ignores, and its kind read from the open
//! file (what is read is what was looked at); the flag is then cleared, so that reads
//! block as they do on any file (a file system that honoured the flag on a regular file
//! could otherwise answer a read with `EAGAIN`).
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

/// Why [`open_regular`] gave no file.
#[derive(Debug)]
pub(crate) enum OpenRegularError {
    /// The open or a look at the open file failed.
    Io(io::Error),
    /// It is not a regular file: what it is, in words.
    NotRegular(&'static str),
}

/// `path` opened to read, with its metadata, where it is a regular file.
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
    clear_nonblocking(&file).map_err(OpenRegularError::Io)?;
    Ok((file, metadata))
}

/// Clears `O_NONBLOCK` on `file`.
#[cfg(unix)]
fn clear_nonblocking(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: `fd` is the open descriptor `file` owns for the whole call; F_GETFL and
    // F_SETFL read and set its status flags and touch no memory.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
