//! Spare segments: files of zeros that a helper thread writes and syncs ahead of use, and that
//! the log renames into place when it starts its next segment (issue 15: a persistent queue's
//! RECEIPTs wait on `fdatasync`, so what one `fdatasync` costs bounds the store's throughput).
//!
//! # Why zeros written beforehand
//! An `fdatasync` after appending to a growing file must also persist the file's new size (and
//! on ext4 the allocation of its new blocks); writing into `fallocate`d space must persist the
//! extents' change from unwritten to written. Overwriting blocks that were written and synced
//! before needs neither: the sync writes the data and flushes the device cache, nothing more.
//! Measured on the development machine (`scripts/fsync-cost.py`, perf/RESULTS.md): `fdatasync`
//! after a 32 KiB write p50 −25 % to −55 % over zeros against appending, and appending and
//! `fallocate` cost the same. The price: every segment's bytes go to the device twice (zeros
//! first), on this thread, off the core's.
//!
//! # How
//! One spare at a time, per log: the thread writes `spare.zeros.tmp` in 128 KiB chunks, each
//! pushed to the device and waited for before the next (`sync_file_range`), then pauses as long
//! as the chunk took: the zeros never queue more than one chunk in front of a commit's
//! `fdatasync` and take at most about half the device's time (a 64 MiB spare took ~0.1 s of
//! writes here, at 128 KiB 0.16 ms a chunk, where 1 MiB chunks took 3.4 ms each, long enough to
//! show in a receipt's p99). Then it syncs the file whole and renames it `spare.zeros`
//! (neither name is a segment's, so the recovery scan never reads them). The log takes it with
//! one `rename` onto the next segment's name (made durable by the directory sync that follows
//! every new segment) and asks for the next spare. When no spare is ready, the log creates an
//! empty segment and appends as before: the spare only ever makes things faster, never waits.
//! A spare is not made while the file system has less than twice its size free, so zeros never
//! take the last room the records need.
//!
//! # Recycled segments instead of zeros
//! Zeros cost a second write of every byte, on the device (where they delay the commits'
//! syncs) and in CPU time (this thread took 0.3 of the 4.8 µs of CPU a persistent queue
//! message cost, perf/RESULTS.md). A segment whose records are all settled is as good a spare: its
//! blocks were written and synced. So the log hands the newest dead segment it made to
//! [`recycle`] (renamed `spare.recycled`) when no spare is ready, and this thread makes that
//! file the spare with one `rename`, writing no zeros; it looks for one before starting zeros
//! and between chunks, and drops a half-written zeros file for it. The new segment overwrites
//! the old records from its start; the records' stamps (`record.rs`) and the zeros the log
//! writes after each batch (`segment.rs`, "Recycled segments") keep the old ones from being
//! read as the new segment's. Zeros are still written for the first spares, before any segment
//! has died, and when segments die slower than they fill.
//!
//! Stopping: the thread checks between chunks and gives up, removing its temporary file;
//! dropping [`Spares`] waits for it, so no thread ever writes into a directory another log (a
//! reopen, a restart) has taken over. A recycled file left by an earlier process is removed
//! at start, like the spares.
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

/// The ready spare's name in the log directory.
const SPARE: &str = "spare.zeros";
/// The spare being written.
const PREPARING: &str = "spare.zeros.tmp";
/// A dead segment given to be the next spare ([`recycle`]).
const RECYCLED: &str = "spare.recycled";
/// Zeros written (and pushed to the device) at a time.
const CHUNK: usize = 128 << 10;

const IDLE: u8 = 0;
const BUSY: u8 = 1;
const READY: u8 = 2;

/// One log's spare segment and the thread that prepares it.
#[derive(Debug)]
pub struct Spares {
    dir: PathBuf,
    state: Arc<AtomicU8>,
    stop: Arc<AtomicBool>,
    ask: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Spares {
    /// Removes spares a previous process left in `dir` (their state is unknown) and starts
    /// preparing one of `bytes`.
    ///
    /// # Errors
    /// The thread could not be started (the log then goes on without spares).
    pub fn start(dir: &Path, bytes: u64) -> io::Result<Spares> {
        for name in [SPARE, PREPARING, RECYCLED] {
            match fs::remove_file(dir.join(name)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        let (ask, asked) = mpsc::channel::<()>();
        let state = Arc::new(AtomicU8::new(IDLE));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (dir, state, stop) = (dir.to_path_buf(), Arc::clone(&state), Arc::clone(&stop));
            std::thread::Builder::new().name("stompgate-zeros".into()).spawn(move || {
                while asked.recv().is_ok() {
                    let made = prepare(&dir, bytes, &stop);
                    if let Err(e) = &made {
                        let _ = fs::remove_file(dir.join(PREPARING));
                        if !stop.load(Ordering::Relaxed) {
                            tracing::warn!(dir = %dir.display(), error = %e, "cannot prepare a spare log segment: the next segment grows by appends");
                        }
                    }
                    state.store(if matches!(made, Ok(true)) { READY } else { IDLE }, Ordering::Release);
                }
            })?
        };
        let spares = Spares { dir: dir.to_path_buf(), state, stop, ask: Some(ask), thread: Some(thread) };
        spares.request();
        Ok(spares)
    }

    /// Whether a spare is ready to be taken.
    pub fn ready(&self) -> bool {
        self.state.load(Ordering::Acquire) == READY
    }

    /// Renames the ready spare to `path` and opens it for writing from its start (then asks
    /// for the next one); `None` when none is ready or the rename failed.
    pub fn take(&self, path: &Path) -> Option<File> {
        if !self.ready() {
            return None;
        }
        let taken = fs::rename(self.dir.join(SPARE), path).and_then(|()| OpenOptions::new().write(true).open(path));
        self.state.store(IDLE, Ordering::Release);
        self.request();
        match taken {
            Ok(file) => Some(file),
            Err(e) => {
                tracing::warn!(segment = %path.display(), error = %e, "cannot take the spare log segment: this segment grows by appends");
                None
            }
        }
    }

    /// Asks the thread for a spare unless one is ready or being made.
    fn request(&self) {
        if self.state.compare_exchange(IDLE, BUSY, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            if let Some(ask) = &self.ask {
                if ask.send(()).is_err() {
                    self.state.store(IDLE, Ordering::Release);
                }
            }
        }
    }
}

impl Drop for Spares {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.ask = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Gives the dead segment at `path` (its records all settled, its file in the log's
/// directory `dir`) to be the next spare: renamed `spare.recycled`, replacing one given before
/// and not yet taken. The caller syncs the directory.
///
/// # Errors
/// The rename's.
pub fn recycle(dir: &Path, path: &Path) -> io::Result<()> {
    fs::rename(path, dir.join(RECYCLED))
}

/// Makes a recycled segment the spare, if one was given. `Ok(false)`: none.
fn take_recycled(dir: &Path) -> io::Result<bool> {
    match fs::rename(dir.join(RECYCLED), dir.join(SPARE)) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Makes the spare: a recycled segment if one was given (before or while zeros are written),
/// else `bytes` of zeros written to the temporary name chunk by chunk, synced and renamed to
/// the spare's name. `Ok(false)`: skipped (too little free space) or stopped.
fn prepare(dir: &Path, bytes: u64, stop: &AtomicBool) -> io::Result<bool> {
    if take_recycled(dir)? {
        return Ok(true);
    }
    if free_bytes(dir)? < bytes.saturating_mul(2) {
        return Ok(false);
    }
    let path = dir.join(PREPARING);
    let mut file = OpenOptions::new().write(true).create(true).truncate(true).open(&path)?;
    let zeros = vec![0u8; CHUNK];
    let mut written = 0u64;
    while written < bytes {
        if stop.load(Ordering::Relaxed) {
            drop(file);
            fs::remove_file(&path)?;
            return Ok(false);
        }
        if take_recycled(dir)? {
            drop(file);
            fs::remove_file(&path)?;
            return Ok(true);
        }
        let n = (bytes - written).min(CHUNK as u64) as usize;
        let began = std::time::Instant::now();
        file.write_all(&zeros[..n])?;
        push_to_device(&file, written, n as u64)?;
        written += n as u64;
        std::thread::sleep(began.elapsed());
    }
    file.sync_all()?;
    fs::rename(&path, dir.join(SPARE))?;
    Ok(true)
}

/// Writes the range back and waits for it (the bytes still need the final sync for the size).
fn push_to_device(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: a plain syscall on a descriptor this function's caller owns; no memory is passed.
    let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), offset as i64, len as i64, flags) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Bytes an unprivileged writer may still use on the file system holding `dir`.
fn free_bytes(dir: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `statvfs` is plain old data, fully written by the call on success.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a valid out pointer.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}
