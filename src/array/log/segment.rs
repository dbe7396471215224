//! Segment files: the log of one core as a directory of numbered, size-capped files that are
//! only ever appended to, scanned on open, and deleted whole.
//!
//! A segment is `{id:020}.seg` (ids from 1, increasing; the name sorts as the number). Other
//! files in the directory are ignored, so a lock file can live beside the segments. A segment
//! is closed once the next batch would take it past `segment_bytes`; a batch is never split, so
//! a batch larger than `segment_bytes` gets a segment of its own.
//!
//! # Written over zeros
//! With [`SegmentLog::with_spares`] (the store's logs), a new segment is a spare: a file of
//! `segment_bytes` zeros written and synced beforehand by a helper thread ([`super::spare`]),
//! which the log renames into place and overwrites from its start, because an `fdatasync`
//! that only overwrites costs less than one that also grows the file (that module says why and
//! what was measured). Until a spare is ready the log appends to a plain file as before, and it
//! moves to the spare's segment as soon as one is. A segment's length in this log is that of
//! its records; the rest of its file is zeros (or a recycled segment's older records, below),
//! which the scan reads as the clean end.
//! Disk: at most two spares per core (a ready one, and a dead segment handed over for the next,
//! below), plus what the active segment has not yet overwritten (and the few bytes a closed
//! segment's last batch did not fill), beyond the records' bytes.
//!
//! # Recycled segments
//! A spare need not be zeros: any file whose blocks were written and synced will do, and a
//! segment whose records are all settled is one. [`SegmentLog::detach_before`] hands the
//! newest dead segment to the spares ([`Removal::run`], `spare::recycle`) when none is ready,
//! which saves the zeros' second write of every byte. Past the new records, such a file holds
//! its earlier life's records, intact. Two things keep them out:
//! * every record carries the stamp of the segment it was written to (`record.rs`; a batch
//!   that lands in another segment than it was encoded for is restamped), and the scan takes
//!   an intact record with another segment's stamp for the end of this one;
//! * over a spare, every batch is written with [`END_MARK_BYTES`] zeros after it (fewer at
//!   the file's end), which the next batch overwrites: the new records' end rarely falls on an
//!   old record's start, and the zeros tell a clean end from a torn record there.
//!
//! Only segments this process made are recycled: an earlier build's may hold version 1 records,
//! which have no stamp and would pass for any segment's.
//!
//! # Writing: one `write`, one `fdatasync`
//! [`SegmentLog::append_batch`] writes a group of encoded records (and, over a spare, their
//! end mark) with one `write_all_at` (one `pwrite(2)` at the records' end unless the kernel
//! returns short); [`SegmentLog::sync`] makes everything appended
//! so far durable with one `fdatasync` of the active segment (plus one for a segment closed since
//! the last sync, and one `fsync` of the directory after a segment was created). The caller
//! decides how often to sync: that is group commit (issue 15 item 2).
//!
//! # Why plain files on the core's thread, not glommio's DMA files
//! * DMA (O_DIRECT) writes need block-aligned offsets and lengths. Group commits of a few
//!   hundred bytes would each pad to a 4 KiB block (space and bandwidth amplification), or
//!   rewrite the partial last block, putting records that were already synced at risk on a torn
//!   block write. A buffered `write(2)` appends exactly the batch's bytes.
//! * A buffered `write(2)` of a batch is a copy into the page cache: microseconds, and enough to
//!   survive `kill -9` (`--store-sync write`). Only `fdatasync` waits for the device (about
//!   0.25 ms for a 32 KiB write on the development machine, issue 15); with group commit that is
//!   once per sync interval, not per message. If blocking the core for it proves too costly, the
//!   same file can be synced from a helper thread through a duplicated descriptor without
//!   changing anything here.
//! * Reading back message bodies of a backlog kept on disk (item 5) hits the page cache for
//!   recently written data; O_DIRECT reads always go to the device.
//! * This layer then needs no executor: it is tested, and reused, as plain synchronous code.
//!
//! # Recovery scan and the resync rule
//! [`SegmentLog::open`] reads every segment in id order and hands each good record, in order, to
//! the caller. When the bytes at a position are not a good record (bad magic, length out of
//! bounds, checksum mismatch, or too few bytes), the scanner looks for the next occurrence of
//! the record magic `SGR1` after that position whose record passes the framing checks
//! (magic, length, CRC-32C), and continues there:
//! * if there is one, the bytes in between are one corrupt region: skipped and counted
//!   ([`Recovery::corrupt_regions`]);
//! * if there is none, the damage runs to the end of the segment: a torn or corrupt tail. The
//!   segment is truncated at the end of its last good record and the cut is reported once
//!   ([`Recovery::tail_cuts`], and one warning line).
//!
//! Only records of this segment count in that search (their stamp, or version 1 without one).
//! When there is none and the bytes at that position are zeros (up to [`END_MARK_BYTES`] of
//! them), there is no damage: that is the part of a spare that no batch reached yet, or a
//! batch's end mark (a record starts with its magic, never with a zero byte), and the
//! segment's records end there, with nothing cut; the bytes past it are zeros or a recycled
//! file's older records. An intact record with another segment's stamp is such an end too. A
//! torn record followed by zeros or older records does not start with zeros, so it is cut as
//! above (a recycled segment cut that way grows by appends from then on).
//!
//! Recovery holds one segment in memory at a time: at most `segment_bytes`, or one batch
//! larger than that.
//!
//! A record whose framing is good but whose content this build cannot read (unknown version or
//! kind, malformed fields) is skipped by its own length and counted
//! ([`Recovery::unreadable`]); it is not damage, so nothing is cut.
//!
//! The magic can occur inside a record's body; resync only happens after damage, and a false
//! match must also pass the checksum over its claimed length. The one way to be fooled is a body
//! that itself contains a complete, valid encoded record and is torn or damaged before it: that
//! inner record is then read as a record. The array must treat records it cannot place (a
//! settlement of an unknown message, a sequence out of order) as noise.
//!
//! # What the array will do with it (issue 15)
//! Each core owns one `SegmentLog` in its own directory under the store directory. It encodes the
//! records of an event-loop turn into one buffer, appends them as one batch and syncs per
//! `--store-sync` before releasing the RECEIPTs (item 2); on start it rebuilds its queues (every
//! message without an Ack or DeadLetter, with its last Requeue receive count) and Events-Store
//! logs (sequences continued) from [`SegmentLog::open`]'s records (item 4); it counts the
//! live messages per segment (`array::persist`, "Which records are live") and deletes the
//! prefix of closed segments that holds none ([`SegmentLog::detach_before`], then
//! [`remove_segments`] off the core's thread; item 5). Only a prefix, oldest first: a
//! settlement is never in an earlier segment than its message, so deleting the settlement
//! without its message, which would bring the settled message back, cannot happen.

use super::record::{self, Record, MAGIC};
use super::spare::{self, Spares};
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// A segment's number: its position in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SegmentId(pub u64);

/// Where a record starts: its segment and byte offset in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    pub segment: SegmentId,
    pub offset: u64,
}

/// A segment whose damaged tail the scan cut off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TailCut {
    pub segment: SegmentId,
    /// The new length: the end of the last good record.
    pub kept: u64,
    /// Bytes removed.
    pub cut: u64,
}

/// What the recovery scan found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Good records handed to the caller.
    pub records: u64,
    /// Damaged regions in the middle of a segment, skipped.
    pub corrupt_regions: u64,
    /// Intact records this build cannot read (newer version, unknown kind), skipped.
    pub unreadable: u64,
    /// Damaged tails, cut.
    pub tail_cuts: Vec<TailCut>,
}

/// The result of scanning one segment's bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SegmentScan {
    pub records: u64,
    pub corrupt_regions: u64,
    pub unreadable: u64,
    /// The length the segment keeps: the end of its last good (or intact but unreadable)
    /// record. Damage before that is skipped, not cut.
    pub good_len: usize,
    /// The records end cleanly at `good_len`: the file ends there, or zeros follow (a spare's
    /// zeros or a batch's end mark), or an older record of a recycled file does. Otherwise
    /// what follows is a torn or damaged tail, to be cut.
    pub clean_end: bool,
}

/// Zeros written after each batch in a segment that overwrites an older file (a spare): the
/// scan reads them as the records' clean end ([`SegmentScan::clean_end`]). A record starts
/// with its magic, never with a zero byte.
pub const END_MARK_BYTES: usize = 16;

/// Scans one segment's bytes: every good record, in order, goes to `on_record` with its offset.
/// `stamp` is the segment's ([`record::stamp_of`] of its id): an intact record with another
/// stamp is an older record of a recycled file, past this segment's end. `None` scans a batch
/// in memory, whatever its records' stamps. Pure: the caller truncates when `good_len <
/// bytes.len()` and the end is not clean.
pub fn scan_segment<'a>(bytes: &'a [u8], stamp: Option<u32>, mut on_record: impl FnMut(u64, Record<'a>)) -> SegmentScan {
    let mut scan = SegmentScan::default();
    let mut pos = 0;
    while pos < bytes.len() {
        // A record is this segment's when it has no stamp (version 1) or this segment's.
        let framed = record::frame(&bytes[pos..]).map(|f| (f.len, f.stamp.zip(stamp).is_none_or(|(got, own)| got == own)));
        match framed {
            Ok((len, true)) => {
                match record::decode(&bytes[pos..]) {
                    Ok((rec, _)) => {
                        on_record(pos as u64, rec);
                        scan.records += 1;
                    }
                    Err(_) => scan.unreadable += 1,
                }
                pos += len;
                scan.good_len = pos;
            }
            // An intact record of the file's earlier life as another segment: the end.
            Ok((_, false)) => {
                scan.clean_end = true;
                break;
            }
            Err(_) => match next_frame(bytes, pos + 1, stamp) {
                Some(next) => {
                    scan.corrupt_regions += 1;
                    pos = next;
                }
                None => {
                    // Nothing of this segment's further on: zeros here are its clean end (the
                    // bytes past them, if any, are an older life's), anything else a torn or
                    // damaged tail.
                    scan.clean_end = bytes[pos..(pos + END_MARK_BYTES).min(bytes.len())].iter().all(|&b| b == 0);
                    break;
                }
            },
        }
    }
    // No bytes after the last record is a clean end too (as an empty run of zeros), whether
    // the records fill the file or the zeros past a torn record gave back its last bytes.
    if scan.good_len == bytes.len() {
        scan.clean_end = true;
    }
    scan
}

/// The first position at or after `from` where a record of this segment (`stamp`, or any
/// with `None`) with good framing starts. An older record of a recycled file is refused by
/// its stamp before its checksum is computed.
fn next_frame(bytes: &[u8], from: usize, stamp: Option<u32>) -> Option<usize> {
    let rest = bytes.get(from..)?;
    memchr::memmem::find_iter(rest, &MAGIC).map(|i| from + i).find(|&at| match stamp {
        Some(stamp) => record::frame_stamped(&bytes[at..], stamp).is_ok(),
        None => record::frame_len(&bytes[at..]).is_ok(),
    })
}

/// One core's log: the segments in a directory, the last one open for appends.
#[derive(Debug)]
pub struct SegmentLog {
    dir: PathBuf,
    segment_bytes: u64,
    /// Every segment on disk, with its length.
    segments: BTreeMap<SegmentId, u64>,
    active_id: SegmentId,
    active: File,
    /// Segments closed since the last sync, still to be synced.
    closed_unsynced: Vec<File>,
    /// A segment was created since the last sync: its directory entry must be synced too.
    dir_unsynced: bool,
    /// Bytes appended since the last sync.
    unsynced_bytes: u64,
    /// A failed append left bytes that could not be cut: start a new segment first.
    roll_before_append: bool,
    /// Where new segments come from when a spare is ready (`with_spares`).
    spares: Option<Spares>,
    /// The active segment's file goes on past its records (a spare: zeros, or a recycled
    /// segment's older records), so appends overwrite it.
    active_overwrites: bool,
    /// The active segment's file length (at least its records').
    active_file_len: u64,
    /// Segments from this id on were made by this process: only those are recycled (an
    /// earlier build's segments may hold records without a stamp, which would pass for a
    /// recycled file's own).
    own_from: SegmentId,
}

impl SegmentLog {
    /// Opens (creating it if missing) the log in `dir`, hands every good record of every
    /// segment to `on_record` in log order, cuts damaged tails, and leaves the last segment
    /// open for appends (a new one in an empty directory).
    ///
    /// # Errors
    /// Any I/O error, with the path it concerns in its message: a directory that cannot be
    /// created or read, a segment that cannot be read, truncated or created (a read-only
    /// directory fails here, before any record is accepted).
    pub fn open(dir: &Path, segment_bytes: u64, mut on_record: impl FnMut(Position, Record<'_>)) -> io::Result<(SegmentLog, Recovery)> {
        fs::create_dir_all(dir).map_err(|e| at_path(e, "cannot create the log directory", dir))?;
        let ids = list_segments(dir)?;
        let mut recovery = Recovery::default();
        let mut segments = BTreeMap::new();
        for &id in &ids {
            let path = segment_path(dir, id);
            let bytes = fs::read(&path).map_err(|e| at_path(e, "cannot read segment", &path))?;
            let scan = scan_segment(&bytes, Some(record::stamp_of(id.0)), |offset, rec| on_record(Position { segment: id, offset }, rec));
            recovery.records += scan.records;
            recovery.corrupt_regions += scan.corrupt_regions;
            recovery.unreadable += scan.unreadable;
            if scan.good_len < bytes.len() && !scan.clean_end {
                truncate(&path, scan.good_len as u64)?;
                let cut = TailCut { segment: id, kept: scan.good_len as u64, cut: (bytes.len() - scan.good_len) as u64 };
                tracing::warn!(segment = %path.display(), kept = cut.kept, cut = cut.cut, "log segment has a torn or corrupt tail: cut at the last good record");
                recovery.tail_cuts.push(cut);
            }
            segments.insert(id, scan.good_len as u64);
        }
        let (active_id, active, dir_unsynced) = match segments.last_key_value() {
            Some((&id, &len)) => (id, open_at(&segment_path(dir, id), len)?, false),
            None => (SegmentId(1), create_segment(dir, SegmentId(1))?, true),
        };
        let own_from = if dir_unsynced { active_id } else { SegmentId(active_id.0 + 1) };
        let active_len = *segments.entry(active_id).or_insert(0);
        let active_file_len = active.metadata().map_err(|e| at_path(e, "cannot read segment", &segment_path(dir, active_id)))?.len().max(active_len);
        let log = SegmentLog {
            dir: dir.to_path_buf(),
            segment_bytes,
            segments,
            active_id,
            active,
            closed_unsynced: Vec::new(),
            dir_unsynced,
            unsynced_bytes: 0,
            roll_before_append: false,
            spares: None,
            active_overwrites: active_file_len > active_len,
            active_file_len,
            own_from,
        };
        Ok((log, recovery))
    }

    /// From now on, new segments are spares written over zeros when one is ready (see the
    /// module doc), prepared by a thread of this log's own. Without the thread (it could not
    /// be started) the log goes on appending, with one warning line.
    #[must_use]
    pub fn with_spares(mut self) -> SegmentLog {
        match Spares::start(&self.dir, self.segment_bytes) {
            Ok(spares) => self.spares = Some(spares),
            Err(e) => tracing::warn!(dir = %self.dir.display(), error = %e, "cannot start preparing spare log segments: segments grow by appends"),
        }
        self
    }

    /// Appends a group of whole encoded records with one write, first closing the active
    /// segment and starting the next when they would take it past `segment_bytes`. Returns
    /// where the batch starts. Not durable until [`sync`](Self::sync).
    ///
    /// The records are stamped for the segment they land in ([`record::restamp`]: only when it
    /// is not the one they were encoded for). Over a spare the write carries
    /// [`END_MARK_BYTES`] zeros after them (fewer at the file's end; `records` lends the room
    /// and is given back as it was, stamps apart), the clean end the next batch overwrites.
    ///
    /// # Errors
    /// The write's or the new segment's I/O error (e.g. no space left). The whole batch then
    /// counts as not written: a partial write is cut off again, or, if that fails too, left
    /// as the torn tail of a segment closed at once (the next open cuts it), so later batches
    /// never follow partial bytes.
    pub fn append_batch(&mut self, records: &mut Vec<u8>) -> io::Result<Position> {
        use std::os::unix::fs::FileExt;
        if records.is_empty() {
            return Ok(Position { segment: self.active_id, offset: self.active_len() });
        }
        if self.roll_before_append || (self.active_len() > 0 && self.active_len() + records.len() as u64 > self.segment_bytes) {
            self.roll()?;
            self.roll_before_append = false;
        } else if !self.active_overwrites {
            // A plain segment is left for a spare as soon as one is ready: its syncs cost more.
            self.move_to_a_spare();
        }
        let at = Position { segment: self.active_id, offset: self.active_len() };
        record::restamp(records, record::stamp_of(self.active_id.0));
        let len = records.len();
        let end = at.offset + len as u64;
        let mark = self.active_file_len.saturating_sub(end).min(END_MARK_BYTES as u64) as usize;
        records.resize(len + mark, 0);
        let written = self.active.write_all_at(records, at.offset);
        records.truncate(len);
        if let Err(e) = written {
            // Partial bytes left there would sit between this segment's records and the next
            // batch: cut them (the segment then grows by appends) and write there again.
            let cut = self.active.set_len(at.offset);
            self.active_overwrites = false;
            self.active_file_len = at.offset;
            if cut.is_err() {
                self.roll_before_append = true;
            }
            return Err(at_path(e, "cannot append to segment", &segment_path(&self.dir, self.active_id)));
        }
        self.active_file_len = self.active_file_len.max(end);
        *self.segments.entry(self.active_id).or_insert(0) += len as u64;
        self.unsynced_bytes += len as u64;
        Ok(at)
    }

    /// Makes every batch appended so far durable (`fdatasync`).
    ///
    /// # Errors
    /// The sync's error. After a failed `fdatasync` Linux may have dropped the unwritten pages
    /// and a retry can report success without them: the caller must treat every batch since
    /// the last successful sync as possibly lost (confirm none of them), not retry and go on.
    pub fn sync(&mut self) -> io::Result<()> {
        for file in self.closed_unsynced.drain(..) {
            file.sync_data()?;
        }
        if self.unsynced_bytes > 0 {
            self.active.sync_data()?;
            self.unsynced_bytes = 0;
        }
        if self.dir_unsynced {
            sync_dir(&self.dir)?;
            self.dir_unsynced = false;
        }
        Ok(())
    }

    /// Starts a sync of every batch appended so far, to be finished by [`PendingSync::run`]
    /// — on another thread if the caller likes (its files are duplicated descriptors): the
    /// core writes on its own thread and waits for the device elsewhere. Same contract as
    /// [`sync`](Self::sync): a failed run means every batch since the last good sync may be
    /// lost.
    ///
    /// # Errors
    /// Duplicating the active segment's descriptor failed (nothing was reset).
    pub fn begin_sync(&mut self) -> io::Result<PendingSync> {
        let active = if self.unsynced_bytes > 0 { Some(self.active.try_clone()?) } else { None };
        let pending = PendingSync { closed: std::mem::take(&mut self.closed_unsynced), active, dir: self.dir_unsynced.then(|| self.dir.clone()) };
        self.unsynced_bytes = 0;
        self.dir_unsynced = false;
        Ok(pending)
    }

    /// Deletes segment `id`, which the caller knows holds only records it no longer needs, and
    /// syncs the directory so the deletion is not undone by a power loss (see the module doc:
    /// deletion order matters).
    ///
    /// # Errors
    /// `InvalidInput` for the active segment (it is still being written), `NotFound` for an id
    /// that is not on disk, or the unlink's error.
    pub fn delete_segment(&mut self, id: SegmentId) -> io::Result<()> {
        if id == self.active_id {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("segment {} is the active segment", id.0)));
        }
        if !self.segments.contains_key(&id) {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("no segment {} in {}", id.0, self.dir.display())));
        }
        let path = segment_path(&self.dir, id);
        fs::remove_file(&path).map_err(|e| at_path(e, "cannot delete segment", &path))?;
        self.segments.remove(&id);
        sync_dir(&self.dir)
    }

    /// Takes the closed segments older than `before` out of the log, oldest first, for
    /// [`Removal::run`] (which may run on another thread: the unlinks and directory syncs are
    /// syscalls that can wait for the device). The log forgets them at once; until they are
    /// unlinked they are only dead files that a restart would scan again and find nothing live
    /// in. Never the active segment. The newest of them becomes the next spare instead of
    /// being unlinked ("Recycled segments" in the module doc) when the log has spares, none
    /// is ready, and this process made it.
    pub fn detach_before(&mut self, before: SegmentId) -> Removal {
        let ids: Vec<SegmentId> = self.segments.range(..before).map(|(&id, _)| id).filter(|&id| id != self.active_id).collect();
        let recycle_last = ids.last().is_some_and(|&id| id >= self.own_from) && self.spares.as_ref().is_some_and(|s| !s.ready());
        let paths = ids
            .into_iter()
            .map(|id| {
                self.segments.remove(&id);
                segment_path(&self.dir, id)
            })
            .collect();
        Removal { dir: self.dir.clone(), paths, recycle_last: recycle_last.then_some(self.segment_bytes) }
    }

    /// Bytes of every segment on disk (what `--store-max-bytes` caps).
    pub fn disk_bytes(&self) -> u64 {
        self.segments.values().sum()
    }

    /// Forgets what a sync would have made durable, without syncing (`--store-sync write`):
    /// closed segments' descriptors are dropped rather than kept for a sync that never comes.
    pub fn skip_sync(&mut self) {
        self.closed_unsynced.clear();
        self.unsynced_bytes = 0;
        self.dir_unsynced = false;
    }

    /// The segments on disk, oldest first, with their lengths.
    pub fn segments(&self) -> impl Iterator<Item = (SegmentId, u64)> + '_ {
        self.segments.iter().map(|(&id, &len)| (id, len))
    }

    /// The segment appends go to.
    pub fn active_segment(&self) -> SegmentId {
        self.active_id
    }

    /// The directory this log lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn active_len(&self) -> u64 {
        self.segments.get(&self.active_id).copied().unwrap_or(0)
    }

    /// Closes the active segment (synced at the next `sync`) and starts the next one: the
    /// spare when one is ready, else an empty file.
    fn roll(&mut self) -> io::Result<()> {
        let next = SegmentId(self.active_id.0 + 1);
        match self.spares.as_ref().and_then(|s| s.take(&segment_path(&self.dir, next))) {
            Some(file) => self.start_segment(next, file, true),
            None => {
                let file = create_segment(&self.dir, next)?;
                self.start_segment(next, file, false);
            }
        }
        Ok(())
    }

    /// Closes the active segment for the spare, when one is ready; else, or when taking it
    /// fails, the active segment stays.
    fn move_to_a_spare(&mut self) {
        let next = SegmentId(self.active_id.0 + 1);
        if let Some(file) = self.spares.as_ref().and_then(|s| s.take(&segment_path(&self.dir, next))) {
            self.start_segment(next, file, true);
        }
    }

    /// Makes `file` the active segment `next`, the active one closed (synced at the next sync).
    /// `spare`: the file is a spare, `segment_bytes` long or more, overwritten from its start.
    fn start_segment(&mut self, next: SegmentId, file: File, spare: bool) {
        self.active_overwrites = spare;
        // A spare's length, asked once a segment; a fresh file is empty.
        self.active_file_len = if spare { file.metadata().map_or(self.segment_bytes, |m| m.len()) } else { 0 };
        let closed = std::mem::replace(&mut self.active, file);
        if self.unsynced_bytes > 0 {
            self.closed_unsynced.push(closed);
        }
        self.active_id = next;
        self.segments.insert(next, 0);
        self.dir_unsynced = true;
    }
}

/// The syscalls of one sync, detached from the log (see [`SegmentLog::begin_sync`]).
#[derive(Debug)]
pub struct PendingSync {
    closed: Vec<File>,
    active: Option<File>,
    dir: Option<PathBuf>,
}

impl PendingSync {
    /// Whether there is nothing to make durable.
    pub fn is_empty(&self) -> bool {
        self.closed.is_empty() && self.active.is_none() && self.dir.is_none()
    }

    /// `fdatasync` of every segment written since the last sync, then the directory's `fsync`
    /// if a segment was created.
    ///
    /// # Errors
    /// The first failed sync.
    pub fn run(self) -> io::Result<()> {
        for file in self.closed.iter().chain(self.active.iter()) {
            file.sync_data()?;
        }
        match &self.dir {
            Some(dir) => sync_dir(dir),
            None => Ok(()),
        }
    }
}

/// Closed segments [`SegmentLog::detach_before`] took out of the log, to be removed.
#[derive(Debug)]
pub struct Removal {
    dir: PathBuf,
    paths: Vec<PathBuf>,
    /// The last one becomes the next spare if its file is at least this long.
    recycle_last: Option<u64>,
}

impl Removal {
    /// The segment files, oldest first.
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// Removes the segments oldest first, each gone before the next (see [`remove_segments`]),
    /// the last one perhaps by giving it to the spares ([`spare::recycle`]). Returns whether
    /// it did.
    ///
    /// # Errors
    /// The first failed unlink, rename or directory sync; the files after it are left in
    /// place.
    pub fn run(self) -> io::Result<bool> {
        let Some((last, older)) = self.paths.split_last() else { return Ok(false) };
        remove_segments(&self.dir, older)?;
        if let Some(min_len) = self.recycle_last {
            // A short file (a plain segment closed early for a spare) would soon grow by
            // appends again: not worth keeping.
            if fs::metadata(last).is_ok_and(|m| m.len() >= min_len) {
                spare::recycle(&self.dir, last).map_err(|e| at_path(e, "cannot recycle segment", last))?;
                sync_dir(&self.dir)?;
                return Ok(true);
            }
        }
        remove_segments(&self.dir, std::slice::from_ref(last))?;
        Ok(false)
    }
}

/// Unlinks segment files in the order given (oldest first, from
/// [`SegmentLog::detach_before`]), syncing the directory after each, so that even after a
/// power loss the segments left are always a suffix of the log: an older segment never
/// survives a newer one's deletion (its messages' settlements may have been in the newer one).
/// A file already gone is not an error.
///
/// # Errors
/// The first failed unlink or directory sync; the files after it are left in place.
pub fn remove_segments(dir: &Path, paths: &[PathBuf]) -> io::Result<()> {
    for path in paths {
        match fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(at_path(e, "cannot delete segment", path)),
        }
        sync_dir(dir)?;
    }
    Ok(())
}

/// Records lying at most this far apart in one segment are read with one `pread` (the bytes
/// between, settlements of other messages, are read and thrown away: cheaper than a second
/// syscall).
const READ_GAP: u64 = 16 << 10;
/// Longest single `pread` of [`read_records`]: a run of records is split past this.
const READ_RUN: u64 = 1 << 20;

/// Reads records back from the segments in `dir`: each of `wanted` is (where it starts, its
/// length); the answer has one entry per asked record, in the order asked. Records near each
/// other in one segment (within [`READ_GAP`]) share one `pread`, so reading a backlog's
/// records back in log order costs about one syscall per [`READ_RUN`] bytes. Blocking: the
/// array runs it off the core's thread (`engine::durable`). A segment deleted meanwhile gives
/// `NotFound` for its records. The bytes are not checked here: the caller decodes them,
/// which verifies the checksum.
pub fn read_records(dir: &Path, wanted: &[(Position, u32)]) -> Vec<io::Result<Vec<u8>>> {
    use std::os::unix::fs::FileExt;
    let mut order: Vec<usize> = (0..wanted.len()).collect();
    order.sort_unstable_by_key(|&i| wanted[i].0);
    let mut answers: Vec<Option<io::Result<Vec<u8>>>> = (0..wanted.len()).map(|_| None).collect();
    let mut open: Option<(SegmentId, io::Result<File>)> = None;
    let mut k = 0;
    while k < order.len() {
        let (first, _) = wanted[order[k]];
        // The run: records of this segment starting within READ_GAP of the run's end so far.
        let mut end = first.offset + u64::from(wanted[order[k]].1);
        let mut next = k + 1;
        while let Some(&i) = order.get(next) {
            let (at, len) = wanted[i];
            let at_end = at.offset + u64::from(len);
            if at.segment != first.segment || at.offset > end + READ_GAP || at_end.max(end) - first.offset > READ_RUN {
                break;
            }
            end = end.max(at_end);
            next += 1;
        }
        if !matches!(&open, Some((id, _)) if *id == first.segment) {
            open = None;
        }
        let (_, file) = open.get_or_insert_with(|| {
            let path = segment_path(dir, first.segment);
            (first.segment, File::open(&path).map_err(|e| at_path(e, "cannot open segment", &path)))
        });
        let run = match file {
            Ok(file) => {
                let mut buf = vec![0; (end - first.offset) as usize];
                file.read_exact_at(&mut buf, first.offset).map(|()| buf).map_err(|e| at_path(e, "cannot read segment", &segment_path(dir, first.segment)))
            }
            Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
        };
        for &i in &order[k..next] {
            let (at, len) = wanted[i];
            let from = (at.offset - first.offset) as usize;
            answers[i] = Some(match &run {
                Ok(buf) => Ok(buf[from..from + len as usize].to_vec()),
                Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
            });
        }
        k = next;
    }
    answers.into_iter().map(|a| a.expect("every record is in one run")).collect()
}

fn segment_path(dir: &Path, id: SegmentId) -> PathBuf {
    dir.join(format!("{:020}.seg", id.0))
}

/// The segment ids in `dir`, ascending. Names that are not `<digits>.seg` are not ours.
fn list_segments(dir: &Path) -> io::Result<Vec<SegmentId>> {
    let mut ids = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| at_path(e, "cannot list the log directory", dir))? {
        let entry = entry.map_err(|e| at_path(e, "cannot list the log directory", dir))?;
        let name = entry.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".seg")) else { continue };
        if stem.is_empty() || !stem.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Ok(id) = stem.parse() {
            ids.push(SegmentId(id));
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

/// A new, empty segment. Segments are written at their records' end with the file's own
/// offset (not `O_APPEND`: a spare's file is longer than its records).
fn create_segment(dir: &Path, id: SegmentId) -> io::Result<File> {
    let path = segment_path(dir, id);
    OpenOptions::new().write(true).create_new(true).open(&path).map_err(|e| at_path(e, "cannot create segment", &path))
}

/// An existing segment, open for writing at `len` (the end of its records).
fn open_at(path: &Path, len: u64) -> io::Result<File> {
    let mut file = OpenOptions::new().write(true).open(path).map_err(|e| at_path(e, "cannot open segment", path))?;
    file.seek(SeekFrom::Start(len)).map_err(|e| at_path(e, "cannot open segment", path))?;
    Ok(file)
}

fn truncate(path: &Path, len: u64) -> io::Result<()> {
    let file = OpenOptions::new().write(true).open(path).map_err(|e| at_path(e, "cannot open segment to cut its tail", path))?;
    file.set_len(len).map_err(|e| at_path(e, "cannot cut the tail of segment", path))?;
    file.sync_data().map_err(|e| at_path(e, "cannot sync segment", path))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| at_path(e, "cannot sync the log directory", dir))
}

/// The error, same kind, with what failed and where: "cannot create segment /x/…: Permission
/// denied (os error 13)".
fn at_path(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::log::record::{encode, Content, QueueSettle, Settlement, StoreMessage};
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A fresh directory under the system temp dir, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> TempDir {
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!("stompgate-log-{}-{n}-{name}", std::process::id()));
            let _ = fs::remove_dir_all(&path);
            fs::create_dir_all(&path).unwrap();
            TempDir(path)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// An Events-Store record whose body says which one it is.
    fn store_record(buf: &mut Vec<u8>, sequence: u64, body: &[u8]) {
        let content = Content { body, timestamp_ns: sequence as i64, ..Content::default() };
        encode(&Record::StoreMessage(StoreMessage { channel: b"prices", sequence, content }), record::stamp_of(1), buf).unwrap();
    }

    /// Opens the log and returns it, its report, and the Events-Store sequences and
    /// positions it recovered, in order.
    fn reopen(dir: &Path, segment_bytes: u64) -> (SegmentLog, Recovery, Vec<(u64, Position)>) {
        let mut seen = Vec::new();
        let (log, recovery) = SegmentLog::open(dir, segment_bytes, |pos, rec| match rec {
            Record::StoreMessage(m) => seen.push((m.sequence, pos)),
            Record::QueueSettle(s) => seen.push((s.seq, pos)),
            other => panic!("unexpected record {other:?}"),
        })
        .unwrap();
        (log, recovery, seen)
    }

    fn seqs(seen: &[(u64, Position)]) -> Vec<u64> {
        seen.iter().map(|&(s, _)| s).collect()
    }

    /// The length of a `write_records` record ("body NNN"), and a segment size with room for
    /// three of them (and half of a fourth).
    fn three_records_a_segment() -> (u64, u64) {
        let mut one = Vec::new();
        store_record(&mut one, 1, b"body 001");
        let record_len = one.len() as u64;
        (record_len, record_len * 3 + record_len / 2)
    }

    /// Appends store records `from..=to` ("body NNN"), one batch each, calling `before` ahead
    /// of each batch, then syncs.
    fn append_records(log: &mut SegmentLog, from: u64, to: u64, before: impl Fn(&SegmentLog)) {
        let mut buf = Vec::new();
        for seq in from..=to {
            before(log);
            buf.clear();
            store_record(&mut buf, seq, format!("body {seq:03}").as_bytes());
            log.append_batch(&mut buf).unwrap();
        }
        log.sync().unwrap();
    }

    /// Writes store records 1..=n, one batch each, syncs and drops the log.
    fn write_records(dir: &Path, segment_bytes: u64, n: u64) {
        let (mut log, _, _) = reopen(dir, segment_bytes);
        append_records(&mut log, 1, n, |_| {});
    }

    #[test]
    fn a_missing_directory_is_created_with_one_empty_segment() {
        let tmp = TempDir::new("missing");
        let dir = tmp.0.join("core-0");
        let (log, recovery, seen) = reopen(&dir, 4096);
        assert!(seen.is_empty());
        assert_eq!(recovery, Recovery::default());
        assert_eq!(log.segments().collect::<Vec<_>>(), vec![(SegmentId(1), 0)]);
        assert!(dir.join("00000000000000000001.seg").is_file());
    }

    #[test]
    fn an_empty_directory_recovers_nothing_and_ignores_foreign_files() {
        let tmp = TempDir::new("empty");
        fs::write(tmp.0.join("LOCK"), b"pid").unwrap();
        fs::write(tmp.0.join("notes.seg.bak"), b"junk").unwrap();
        let (log, recovery, seen) = reopen(&tmp.0, 4096);
        assert!(seen.is_empty());
        assert_eq!(recovery, Recovery::default());
        assert_eq!(log.active_segment(), SegmentId(1));
        assert_eq!(fs::read(tmp.0.join("LOCK")).unwrap(), b"pid");
    }

    #[test]
    fn batches_of_every_kind_come_back_in_order_after_reopen() {
        use crate::array::log::record::QueueMessage;
        let tmp = TempDir::new("roundtrip");
        let (mut log, _, _) = reopen(&tmp.0, 1 << 20);
        let content = Content { id: b"m1", body: b"work", tags: vec![(b"k", b"v")], timestamp_ns: 9, ..Content::default() };
        let queued = QueueMessage { channel: b"q", seq: 1, content, max_receive: 2, dead_letter: Some(b"q.dlq"), ..QueueMessage::default() };
        let settle = |seq, settlement| Record::QueueSettle(QueueSettle { channel: b"q", seq, settlement });
        let mut written = Vec::new();
        encode(&Record::QueueMessage(queued.clone()), 1, &mut written).unwrap();
        encode(&settle(1, Settlement::Requeue { receive_count: 1 }), 1, &mut written).unwrap();
        encode(&settle(1, Settlement::DeadLetter { target: Some(b"q.dlq") }), 1, &mut written).unwrap();
        let first_batch = written.len();
        encode(&Record::QueueMessage(QueueMessage { channel: b"q.dlq", rerouted_from: Some(b"q"), ..queued }), 1, &mut written).unwrap();
        encode(&settle(1, Settlement::Ack), 1, &mut written).unwrap();
        store_record(&mut written, 1, b"tick");
        assert_eq!(log.append_batch(&mut written[..first_batch].to_vec()).unwrap(), Position { segment: SegmentId(1), offset: 0 });
        let second = log.append_batch(&mut written[first_batch..].to_vec()).unwrap();
        assert_eq!(second, Position { segment: SegmentId(1), offset: first_batch as u64 });
        log.sync().unwrap();
        drop(log);
        // Re-encoding what was recovered, in order, gives back exactly the bytes written.
        let mut recovered = Vec::new();
        let mut offsets = Vec::new();
        let (_, recovery) = SegmentLog::open(&tmp.0, 1 << 20, |pos, rec| {
            offsets.push(pos.offset);
            assert_eq!(pos.offset, recovered.len() as u64);
            encode(&rec, 1, &mut recovered).unwrap();
        })
        .unwrap();
        assert_eq!(recovered, written);
        assert_eq!(recovery.records, 6);
        assert!(offsets.contains(&(first_batch as u64)));
        assert!(recovery.tail_cuts.is_empty());
    }

    #[test]
    fn a_full_segment_rolls_over_and_batches_are_never_split() {
        let tmp = TempDir::new("rollover");
        let (record_len, segment_bytes) = three_records_a_segment();
        write_records(&tmp.0, segment_bytes, 10);
        let (mut log, recovery, seen) = reopen(&tmp.0, segment_bytes);
        assert_eq!(seqs(&seen), (1..=10).collect::<Vec<_>>());
        assert_eq!(recovery.records, 10);
        let segments: Vec<_> = log.segments().collect();
        assert_eq!(segments, vec![(SegmentId(1), 3 * record_len), (SegmentId(2), 3 * record_len), (SegmentId(3), 3 * record_len), (SegmentId(4), record_len)]);
        assert!(seen.iter().all(|&(_, pos)| pos.offset + record_len <= segment_bytes));
        // A batch larger than a segment gets one of its own.
        let mut big = Vec::new();
        for seq in 11..=15 {
            store_record(&mut big, seq, format!("body {seq:03}").as_bytes());
        }
        let at = log.append_batch(&mut big).unwrap();
        assert_eq!(at, Position { segment: SegmentId(5), offset: 0 });
        log.sync().unwrap();
        drop(log);
        let (_, _, seen) = reopen(&tmp.0, segment_bytes);
        assert_eq!(seqs(&seen), (1..=15).collect::<Vec<_>>());
    }

    #[test]
    fn a_torn_last_record_is_cut_at_every_byte_offset() {
        let tmp = TempDir::new("torn");
        write_records(&tmp.0, 1 << 20, 3);
        let path = segment_path(&tmp.0, SegmentId(1));
        let whole = fs::read(&path).unwrap();
        let mut last = Vec::new();
        store_record(&mut last, 3, b"body 003");
        let last_start = whole.len() - last.len();
        for keep in last_start..whole.len() {
            fs::write(&path, &whole[..keep]).unwrap();
            let (mut log, recovery, seen) = reopen(&tmp.0, 1 << 20);
            assert_eq!(seqs(&seen), vec![1, 2], "torn at {keep}");
            assert_eq!(recovery.corrupt_regions, 0, "torn at {keep}");
            let expected_cuts =
                if keep == last_start { vec![] } else { vec![TailCut { segment: SegmentId(1), kept: last_start as u64, cut: (keep - last_start) as u64 }] };
            assert_eq!(recovery.tail_cuts, expected_cuts, "torn at {keep}");
            assert_eq!(fs::metadata(&path).unwrap().len(), last_start as u64, "torn at {keep}");
            // The log goes on after the cut: a new record lands where the torn one began.
            let mut buf = Vec::new();
            store_record(&mut buf, 3, b"again");
            assert_eq!(log.append_batch(&mut buf).unwrap().offset, last_start as u64);
            log.sync().unwrap();
            drop(log);
            let (_, recovery, seen) = reopen(&tmp.0, 1 << 20);
            assert_eq!(seqs(&seen), vec![1, 2, 3], "torn at {keep}, appended");
            assert!(recovery.tail_cuts.is_empty(), "a cut tail is reported once, at {keep}");
        }
    }

    #[test]
    fn a_bad_checksum_at_the_end_is_a_tail_cut() {
        let tmp = TempDir::new("badtail");
        write_records(&tmp.0, 1 << 20, 4);
        let path = segment_path(&tmp.0, SegmentId(1));
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        fs::write(&path, &bytes).unwrap();
        let (_, recovery, seen) = reopen(&tmp.0, 1 << 20);
        assert_eq!(seqs(&seen), vec![1, 2, 3]);
        assert_eq!(recovery.tail_cuts.len(), 1);
        assert_eq!(recovery.corrupt_regions, 0);
    }

    #[test]
    fn flipped_bytes_in_the_middle_skip_that_record_only() {
        let tmp = TempDir::new("flipped");
        write_records(&tmp.0, 1 << 20, 5);
        let path = segment_path(&tmp.0, SegmentId(1));
        let whole = fs::read(&path).unwrap();
        let record_len = whole.len() / 5;
        // Damage every byte of the third record in turn, magic and length included.
        for i in 2 * record_len..3 * record_len {
            let mut bytes = whole.clone();
            bytes[i] ^= 0xff;
            fs::write(&path, &bytes).unwrap();
            let (_, recovery, seen) = reopen(&tmp.0, 1 << 20);
            assert_eq!(seqs(&seen), vec![1, 2, 4, 5], "byte {i}");
            assert_eq!(recovery.corrupt_regions, 1, "byte {i}");
            assert!(recovery.tail_cuts.is_empty(), "byte {i}");
            assert_eq!(fs::metadata(&path).unwrap().len(), whole.len() as u64, "nothing cut, byte {i}");
        }
    }

    #[test]
    fn garbage_between_records_is_one_corrupt_region() {
        let mut bytes = Vec::new();
        store_record(&mut bytes, 1, b"a");
        bytes.extend_from_slice(b"SGR1 not a record SGR1SGR1 \0\0\0\0");
        store_record(&mut bytes, 2, b"b");
        let mut seen = Vec::new();
        let scan = scan_segment(&bytes, Some(1), |_, rec| seen.push(rec));
        assert_eq!(seen.len(), 2);
        assert_eq!(scan.corrupt_regions, 1);
        assert_eq!(scan.good_len, bytes.len());
    }

    #[test]
    fn damage_in_a_closed_segment_does_not_stop_the_next_one() {
        let tmp = TempDir::new("closed");
        let mut one = Vec::new();
        store_record(&mut one, 1, b"body 001");
        let segment_bytes = one.len() as u64 * 2;
        write_records(&tmp.0, segment_bytes, 6);
        let first = segment_path(&tmp.0, SegmentId(1));
        let mut bytes = fs::read(&first).unwrap();
        let end = bytes.len();
        bytes[end - 3] ^= 1;
        fs::write(&first, &bytes).unwrap();
        let (_, recovery, seen) = reopen(&tmp.0, segment_bytes);
        assert_eq!(seqs(&seen), vec![1, 3, 4, 5, 6]);
        assert_eq!(recovery.tail_cuts.iter().map(|c| c.segment).collect::<Vec<_>>(), vec![SegmentId(1)]);
    }

    #[test]
    fn segments_are_deleted_whole_but_never_the_active_one() {
        let tmp = TempDir::new("delete");
        let mut one = Vec::new();
        store_record(&mut one, 1, b"body 001");
        let segment_bytes = one.len() as u64 * 2;
        write_records(&tmp.0, segment_bytes, 5);
        let (mut log, _, _) = reopen(&tmp.0, segment_bytes);
        assert_eq!(log.active_segment(), SegmentId(3));
        log.delete_segment(SegmentId(1)).unwrap();
        assert!(!segment_path(&tmp.0, SegmentId(1)).exists());
        assert_eq!(log.delete_segment(SegmentId(1)).unwrap_err().kind(), io::ErrorKind::NotFound);
        assert_eq!(log.delete_segment(SegmentId(3)).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        assert_eq!(log.segments().map(|(id, _)| id).collect::<Vec<_>>(), vec![SegmentId(2), SegmentId(3)]);
        drop(log);
        let (_, _, seen) = reopen(&tmp.0, segment_bytes);
        assert_eq!(seqs(&seen), vec![3, 4, 5]);
    }

    #[test]
    fn a_detached_prefix_is_removed_oldest_first_and_the_rest_reopens() {
        let tmp = TempDir::new("detach");
        let mut one = Vec::new();
        store_record(&mut one, 1, b"body 001");
        let segment_bytes = one.len() as u64 * 2;
        write_records(&tmp.0, segment_bytes, 7);
        let (mut log, _, _) = reopen(&tmp.0, segment_bytes);
        assert_eq!(log.active_segment(), SegmentId(4));
        assert_eq!(log.disk_bytes(), 7 * one.len() as u64);
        // Everything before the active segment is asked for: it is never among them.
        let removal = log.detach_before(SegmentId(9));
        let paths = removal.paths().to_vec();
        assert_eq!(paths, vec![segment_path(&tmp.0, SegmentId(1)), segment_path(&tmp.0, SegmentId(2)), segment_path(&tmp.0, SegmentId(3))]);
        assert_eq!(log.segments().map(|(id, _)| id).collect::<Vec<_>>(), vec![SegmentId(4)]);
        assert_eq!(log.disk_bytes(), one.len() as u64);
        remove_segments(&tmp.0, &paths).unwrap();
        remove_segments(&tmp.0, &paths).unwrap(); // already gone: not an error
        assert!(paths.iter().all(|p| !p.exists()));
        drop(log);
        let (_, _, seen) = reopen(&tmp.0, segment_bytes);
        assert_eq!(seqs(&seen), vec![7]);
    }

    #[test]
    fn a_read_only_directory_is_a_clear_io_error() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = TempDir::new("readonly");
        fs::set_permissions(&tmp.0, fs::Permissions::from_mode(0o555)).unwrap();
        // A privileged test process (root, CAP_DAC_OVERRIDE) writes through mode bits; then use
        // sysfs, where the kernel refuses new files to everyone.
        let probe = tmp.0.join("probe");
        let dir = if fs::write(&probe, b"").is_ok() { PathBuf::from("/sys") } else { tmp.0.clone() };
        let err = SegmentLog::open(&dir, 4096, |_, _| {}).unwrap_err();
        fs::set_permissions(&tmp.0, fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
        let text = err.to_string();
        assert!(text.starts_with("cannot create segment "), "{text}");
        assert!(text.contains(&segment_path(&dir, SegmentId(1)).display().to_string()), "{text}");
    }

    #[test]
    fn an_unreadable_intact_record_is_skipped_without_a_cut() {
        let mut bytes = Vec::new();
        store_record(&mut bytes, 1, b"a");
        let at = bytes.len();
        store_record(&mut bytes, 2, b"b");
        // A future kind, checksum recomputed: intact, but not for this build.
        bytes[at + 13] = 200;
        let crc = crc32c::crc32c(&bytes[at + 8..]);
        bytes[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
        store_record(&mut bytes, 3, b"c");
        let mut seen = Vec::new();
        let scan = scan_segment(&bytes, Some(1), |_, rec| seen.push(rec));
        assert_eq!(seen.len(), 2);
        assert_eq!((scan.unreadable, scan.corrupt_regions, scan.good_len), (1, 0, bytes.len()));
    }

    /// Waits (at most 10 s) until the log's spare is ready.
    fn wait_for_spare(log: &SegmentLog) {
        let spares = log.spares.as_ref().expect("the log has spares");
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !spares.ready() {
            assert!(std::time::Instant::now() < until, "no spare segment within 10 s");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    #[test]
    fn segments_written_over_zeros_keep_their_records_and_reopen_without_a_cut() {
        let tmp = TempDir::new("spares");
        let (record_len, segment_bytes) = three_records_a_segment();
        let (log, _, _) = reopen(&tmp.0, segment_bytes);
        let mut log = log.with_spares();
        wait_for_spare(&log);
        assert_eq!(fs::metadata(tmp.0.join("spare.zeros")).unwrap().len(), segment_bytes);
        assert!(fs::read(tmp.0.join("spare.zeros")).unwrap().iter().all(|&b| b == 0));
        write_over_spares(&mut log, 1, 7);
        // The empty plain segment 1 was left for the spare at the first batch; segments 2 to 4
        // are spares: full-size files whose records end before their zeros.
        assert_eq!(
            log.segments().collect::<Vec<_>>(),
            vec![(SegmentId(1), 0), (SegmentId(2), 3 * record_len), (SegmentId(3), 3 * record_len), (SegmentId(4), record_len)]
        );
        for id in 2..=4 {
            assert_eq!(fs::metadata(segment_path(&tmp.0, SegmentId(id))).unwrap().len(), segment_bytes, "segment {id}");
        }
        drop(log);
        let (log, recovery, seen) = reopen(&tmp.0, segment_bytes);
        assert_eq!(seqs(&seen), (1..=7).collect::<Vec<_>>());
        assert_eq!(recovery, Recovery { records: 7, ..Recovery::default() });
        // Appends go on right after the last record, over the zeros, and read back.
        let mut log = log.with_spares();
        let mut buf = Vec::new();
        store_record(&mut buf, 8, b"body 008");
        assert_eq!(log.append_batch(&mut buf).unwrap(), Position { segment: SegmentId(4), offset: record_len });
        log.sync().unwrap();
        drop(log);
        let (_, recovery, seen) = reopen(&tmp.0, segment_bytes);
        assert_eq!(seqs(&seen), (1..=8).collect::<Vec<_>>());
        assert!(recovery.tail_cuts.is_empty());
    }

    #[test]
    fn a_spare_that_cannot_be_taken_leaves_the_batch_on_the_active_segment() {
        let tmp = TempDir::new("spare-gone");
        let (log, _, _) = reopen(&tmp.0, 1 << 16);
        let mut log = log.with_spares();
        wait_for_spare(&log);
        // Ready, but its file is gone: the rename onto the next segment's name fails.
        fs::remove_file(tmp.0.join("spare.zeros")).unwrap();
        let mut buf = Vec::new();
        store_record(&mut buf, 1, b"body 001");
        assert_eq!(log.append_batch(&mut buf).unwrap(), Position { segment: SegmentId(1), offset: 0 });
        assert!(!segment_path(&tmp.0, SegmentId(2)).exists(), "no new segment for a spare that could not be taken");
        log.sync().unwrap();
        drop(log);
        let (_, recovery, seen) = reopen(&tmp.0, 1 << 16);
        assert_eq!((seqs(&seen), recovery.tail_cuts), (vec![1], vec![]));
    }

    #[test]
    fn a_torn_record_over_zeros_is_cut_and_the_log_goes_on() {
        let tmp = TempDir::new("spare-torn");
        let segment_bytes = 1 << 16;
        let (log, _, _) = reopen(&tmp.0, segment_bytes);
        let mut log = log.with_spares();
        wait_for_spare(&log);
        let mut buf = Vec::new();
        for seq in 1..=3 {
            buf.clear();
            store_record(&mut buf, seq, format!("body {seq:03}").as_bytes());
            log.append_batch(&mut buf).unwrap();
        }
        log.sync().unwrap();
        let active = log.active_segment();
        let len = log.segments().last().unwrap().1;
        drop(log);
        // The last record's second half never reached the disk: zeros there, as a crash during
        // the write over a spare leaves it.
        let path = segment_path(&tmp.0, active);
        let mut bytes = fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, segment_bytes);
        let last_start = len as usize - buf.len();
        bytes[last_start + buf.len() / 2..len as usize].fill(0);
        fs::write(&path, &bytes).unwrap();
        let (log, recovery, seen) = reopen(&tmp.0, segment_bytes);
        assert_eq!(seqs(&seen), vec![1, 2]);
        assert_eq!(recovery.tail_cuts, vec![TailCut { segment: active, kept: last_start as u64, cut: segment_bytes - last_start as u64 }]);
        assert_eq!(fs::metadata(&path).unwrap().len(), last_start as u64);
        let mut log = log;
        buf.clear();
        store_record(&mut buf, 3, b"again");
        assert_eq!(log.append_batch(&mut buf).unwrap(), Position { segment: active, offset: last_start as u64 });
        log.sync().unwrap();
        drop(log);
        let (_, recovery, seen) = reopen(&tmp.0, segment_bytes);
        assert_eq!(seqs(&seen), vec![1, 2, 3]);
        assert!(recovery.tail_cuts.is_empty());
    }

    #[test]
    fn spares_left_by_an_earlier_process_are_removed_and_never_read() {
        let tmp = TempDir::new("spare-left");
        write_records(&tmp.0, 1 << 20, 2);
        fs::write(tmp.0.join("spare.zeros"), b"not zeros").unwrap();
        fs::write(tmp.0.join("spare.zeros.tmp"), b"half").unwrap();
        let (log, recovery, seen) = reopen(&tmp.0, 1 << 20);
        assert_eq!((seqs(&seen), recovery.records), (vec![1, 2], 2));
        let log = log.with_spares();
        wait_for_spare(&log);
        assert!(!tmp.0.join("spare.zeros.tmp").exists());
        let spare = fs::read(tmp.0.join("spare.zeros")).unwrap();
        assert_eq!(spare.len(), 1 << 20);
        assert!(spare.iter().all(|&b| b == 0));
    }

    #[test]
    fn dropping_the_log_stops_a_spare_being_written_and_removes_it() {
        let tmp = TempDir::new("spare-stop");
        let (log, _, _) = reopen(&tmp.0, 256 << 20);
        let log = log.with_spares();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let began = std::time::Instant::now();
        drop(log);
        assert!(began.elapsed() < std::time::Duration::from_secs(5), "drop waited {:?}", began.elapsed());
        assert!(!tmp.0.join("spare.zeros.tmp").exists(), "the half-written spare is removed");
        assert!(!tmp.0.join("spare.zeros").exists(), "a 256 MiB spare is not finished in 20 ms");
    }

    /// Writes store records `from..=to` as one batch each, waiting for a spare before each.
    fn write_over_spares(log: &mut SegmentLog, from: u64, to: u64) {
        append_records(log, from, to, wait_for_spare);
    }

    #[test]
    fn a_dead_segment_becomes_the_next_spare_and_its_old_records_never_come_back() {
        let tmp = TempDir::new("recycle");
        let (record_len, segment_bytes) = three_records_a_segment();
        let (log, _, _) = reopen(&tmp.0, segment_bytes);
        let mut log = log.with_spares();
        assert_eq!(log.own_from, SegmentId(1), "a new log made its first segment");
        write_over_spares(&mut log, 1, 7);
        // 1 is the empty plain segment left at the first batch, 2 and 3 full spares, 4 active
        // (7 took the spare that was ready: wait for the thread's next one).
        assert_eq!(log.active_segment(), SegmentId(4));
        wait_for_spare(&log);
        // With a spare ready, dead segments are unlinked: a second spare would only wait.
        let removal = log.detach_before(SegmentId(2));
        assert_eq!(removal.recycle_last, None);
        assert!(!removal.run().unwrap());
        assert!(!segment_path(&tmp.0, SegmentId(1)).exists());
        // Segments 2 and 3 die while no spare is ready (forced here: that is a race with the
        // spare thread otherwise): 2 is unlinked, 3 handed over, and it waits while the spare
        // that is ready is used first.
        let removal = log.detach_before(SegmentId(4));
        let removal = Removal { recycle_last: Some(segment_bytes), ..removal };
        let old = fs::read(segment_path(&tmp.0, SegmentId(3))).unwrap();
        assert!(removal.run().unwrap(), "the newest dead segment is recycled");
        assert!(!segment_path(&tmp.0, SegmentId(2)).exists() && !segment_path(&tmp.0, SegmentId(3)).exists());
        assert_eq!(fs::read(tmp.0.join("spare.recycled")).unwrap(), old);
        // 8 and 9 fill segment 4; 10 takes the ready spare as segment 5, and the thread, asked
        // for the next spare, takes the recycled file instead of writing zeros.
        write_over_spares(&mut log, 8, 12);
        assert_eq!(log.active_segment(), SegmentId(5));
        assert!(!tmp.0.join("spare.recycled").exists());
        assert_eq!(fs::read(tmp.0.join("spare.zeros")).unwrap(), old, "segment 3's file, not zeros");
        // 10 to 12 filled 5; 13 starts segment 6 over segment 3's file: past its one record
        // and its end mark, segment 3's last two records are there, intact.
        write_over_spares(&mut log, 13, 13);
        assert_eq!(log.active_segment(), SegmentId(6));
        let six = fs::read(segment_path(&tmp.0, SegmentId(6))).unwrap();
        assert_eq!(six.len(), old.len(), "the recycled file keeps its length");
        let rl = record_len as usize;
        assert_eq!(six[rl..rl + END_MARK_BYTES], [0; END_MARK_BYTES], "the batch's end mark");
        assert_eq!(six[2 * rl..3 * rl], old[2 * rl..3 * rl], "segment 3's record 6, intact");
        assert_eq!(record::frame(&six[2 * rl..]).unwrap().stamp, Some(3));
        drop(log);
        let (mut log, recovery, seen) = reopen(&tmp.0, segment_bytes);
        // Segments 4 to 6 are left; 3's records (4 to 6) died with it and are not read from 6.
        assert_eq!(seqs(&seen), (7..=13).collect::<Vec<_>>());
        assert_eq!(recovery, Recovery { records: 7, ..Recovery::default() });
        assert_eq!(log.own_from, SegmentId(7), "segments of an earlier process are never recycled");
        // Appends go on over the old records, and a reopen reads exactly what was written.
        let mut buf = Vec::new();
        store_record(&mut buf, 14, b"x");
        assert_eq!(log.append_batch(&mut buf).unwrap(), Position { segment: SegmentId(6), offset: record_len });
        log.sync().unwrap();
        drop(log);
        let (_, recovery, seen) = reopen(&tmp.0, segment_bytes);
        assert_eq!(seqs(&seen), (7..=14).collect::<Vec<_>>());
        assert_eq!((recovery.tail_cuts.len(), recovery.corrupt_regions), (0, 0));
    }

    #[test]
    fn in_a_recycled_segment_damage_is_skipped_or_cut_as_in_any_other() {
        // Segment 9's file held segment 4's records; 9 overwrote the start of it.
        let mut old = Vec::new();
        for seq in 100..140 {
            let content = Content { body: b"old body", timestamp_ns: seq as i64, ..Content::default() };
            encode(&Record::StoreMessage(StoreMessage { channel: b"prices", sequence: seq, content }), record::stamp_of(4), &mut old).unwrap();
        }
        let mut new = Vec::new();
        let mut ends = Vec::new();
        for seq in 1..=5 {
            let content = Content { body: b"new", timestamp_ns: seq as i64, ..Content::default() };
            encode(&Record::StoreMessage(StoreMessage { channel: b"prices", sequence: seq, content }), record::stamp_of(9), &mut new).unwrap();
            ends.push(new.len());
        }
        let scan_of = |bytes: &[u8]| {
            let mut seen = Vec::new();
            let scan = scan_segment(bytes, Some(record::stamp_of(9)), |_, rec| {
                if let Record::StoreMessage(m) = rec {
                    seen.push(m.sequence)
                }
            });
            (seen, scan)
        };
        let over = |new: &[u8], mark: usize| {
            let mut file = old.clone();
            file[..new.len()].copy_from_slice(new);
            file[new.len()..new.len() + mark].fill(0);
            file
        };
        // With its end mark: a clean end, nothing cut.
        let (seen, scan) = scan_of(&over(&new, END_MARK_BYTES));
        assert_eq!((seen, scan.good_len, scan.clean_end, scan.corrupt_regions), (vec![1, 2, 3, 4, 5], new.len(), true, 0));
        // A flipped byte in the third record: that one skipped, the rest read, a clean end.
        let mut bad = over(&new, END_MARK_BYTES);
        bad[ends[1] + 20] ^= 0x10;
        let (seen, scan) = scan_of(&bad);
        assert_eq!((seen, scan.good_len, scan.clean_end, scan.corrupt_regions), (vec![1, 2, 4, 5], new.len(), true, 1));
        // The last record torn (its second half never written: the old bytes there): a tail
        // to cut at the fourth record's end.
        let torn_at = ends[3] + (ends[4] - ends[3]) / 2;
        let (seen, scan) = scan_of(&over(&new[..torn_at], 0));
        assert_eq!((seen, scan.good_len, scan.clean_end, scan.corrupt_regions), (vec![1, 2, 3, 4], ends[3], false, 0));
        // Version 1 records (no stamp) are the segment's wherever they are.
        let v1 = record::as_version_1(&new[..ends[0]]);
        let (seen, scan) = scan_of(&over(&v1, END_MARK_BYTES));
        assert_eq!((seen, scan.clean_end), (vec![1], true));
    }

    proptest::proptest! {
        #[test]
        fn over_zeros_a_cut_between_records_is_a_clean_end_and_any_other_a_tail_cut(
            bodies in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64), 1..8),
            cut in proptest::prelude::any::<proptest::sample::Index>(),
            zeros in 1usize..512,
        ) {
            let mut bytes = Vec::new();
            let mut ends = vec![0];
            for (i, body) in bodies.iter().enumerate() {
                store_record(&mut bytes, i as u64 + 1, body);
                ends.push(bytes.len());
            }
            let whole_bytes = bytes.clone();
            let keep = cut.index(bytes.len() + 1);
            bytes.truncate(keep);
            bytes.resize(keep + zeros, 0);
            let mut seen = Vec::new();
            let scan = scan_segment(&bytes, Some(1), |_, rec| if let Record::StoreMessage(m) = rec { seen.push(m.sequence) });
            // A record survives when the zeros give back its bytes: it ended before the cut, or
            // everything of it after the cut was zeros anyway.
            let whole = ends.windows(2).take_while(|w| w[1] <= bytes.len() && bytes[w[0]..w[1]] == whole_bytes[w[0]..w[1]]).count();
            proptest::prop_assert_eq!(seen, (1..=whole as u64).collect::<Vec<_>>());
            proptest::prop_assert_eq!(scan.good_len, ends[whole]);
            proptest::prop_assert_eq!(scan.clean_end, bytes[ends[whole]..].iter().all(|&b| b == 0));
            proptest::prop_assert_eq!(scan.clean_end, keep <= ends[whole] || whole_bytes[ends[whole]..keep].iter().all(|&b| b == 0));
            proptest::prop_assert_eq!(scan.corrupt_regions, 0);
        }

        #[test]
        fn a_segment_cut_anywhere_yields_exactly_the_records_before_the_cut(
            bodies in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64), 1..8),
            cut in proptest::prelude::any::<proptest::sample::Index>(),
        ) {
            let mut bytes = Vec::new();
            let mut ends = Vec::new();
            for (i, body) in bodies.iter().enumerate() {
                store_record(&mut bytes, i as u64 + 1, body);
                ends.push(bytes.len());
            }
            let keep = cut.index(bytes.len() + 1);
            let mut seen = Vec::new();
            let scan = scan_segment(&bytes[..keep], Some(1), |_, rec| if let Record::StoreMessage(m) = rec { seen.push(m.sequence) });
            let whole = ends.iter().filter(|&&end| end <= keep).count();
            proptest::prop_assert_eq!(seen, (1..=whole as u64).collect::<Vec<_>>());
            proptest::prop_assert_eq!(scan.good_len, if whole == 0 { 0 } else { ends[whole - 1] });
            proptest::prop_assert_eq!(scan.corrupt_regions, 0);
        }

        #[test]
        fn over_a_recycled_file_exactly_the_new_batches_are_read_wherever_a_write_tore(
            old_bodies in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..48), 1..24),
            batches in proptest::collection::vec(proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..48), 1..4), 1..6),
            tear in proptest::prelude::any::<proptest::sample::Index>(),
            torn in proptest::prelude::any::<bool>(),
        ) {
            // The file's earlier life: records of segment 3, then zeros to the file's length.
            let mut file = Vec::new();
            for (i, body) in old_bodies.iter().enumerate() {
                let content = Content { body, timestamp_ns: i as i64, ..Content::default() };
                encode(&Record::StoreMessage(StoreMessage { channel: b"prices", sequence: 1000 + i as u64, content }), record::stamp_of(3), &mut file).unwrap();
            }
            let file_len = file.len().max(1) * 2;
            file.resize(file_len, 0);
            // Segment 8 writes its batches from the start, each with its end mark (cut at the
            // file's end), as append_batch does; the last write may tear anywhere in it.
            let mut at = 0;
            let mut expected = Vec::new();
            let mut seq = 1u64;
            let mut good_len = 0;
            for (b, batch) in batches.iter().enumerate() {
                let mut bytes = Vec::new();
                let mut ends = Vec::new();
                for body in batch {
                    let content = Content { body, timestamp_ns: 0, ..Content::default() };
                    encode(&Record::StoreMessage(StoreMessage { channel: b"prices", sequence: seq, content }), record::stamp_of(8), &mut bytes).unwrap();
                    ends.push((bytes.len(), seq));
                    seq += 1;
                }
                if at + bytes.len() > file_len {
                    break;
                }
                let mark = (file_len - at - bytes.len()).min(END_MARK_BYTES);
                bytes.resize(bytes.len() + mark, 0);
                let last = b + 1 == batches.len();
                let keep = if last && torn { tear.index(bytes.len() + 1) } else { bytes.len() };
                file[at..at + keep].copy_from_slice(&bytes[..keep]);
                // A record is whole when the file holds all of its bytes: written before the
                // tear, or what was there already happened to be the same (zeros, say).
                let mut start = 0;
                for &(end, s) in &ends {
                    if file[at + start..at + end] != bytes[start..end] {
                        break;
                    }
                    expected.push(s);
                    good_len = at + end;
                    start = end;
                }
                at += ends.last().unwrap().0;
            }
            let mut seen = Vec::new();
            let scan = scan_segment(&file, Some(record::stamp_of(8)), |_, rec| if let Record::StoreMessage(m) = rec { seen.push(m.sequence) });
            // Every whole new record, nothing of the old life, never a skipped region.
            proptest::prop_assert_eq!(seen, expected);
            proptest::prop_assert_eq!(scan.good_len, good_len);
            proptest::prop_assert_eq!(scan.corrupt_regions, 0);
            if !torn {
                proptest::prop_assert!(scan.clean_end, "a batch that was written whole ends cleanly");
            }
        }

        #[test]
        fn scan_never_panics_and_keeps_a_prefix(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048)) {
            let scan = scan_segment(&bytes, Some(1), |_, _| {});
            proptest::prop_assert!(scan.good_len <= bytes.len());
        }
    }
}
