//! The per-core append-only log under the persistent embedded array (issue 15, item 1): the
//! bottom layer, with no runtime (`engine::durable` drives it, `array::persist` says what
//! goes in it).
//!
//! * [`record`]: the on-disk record (magic, CRC-32C, length, version, kind, fields) for queue
//!   messages, their settlements and Events-Store messages; encoding into a caller's buffer,
//!   decoding that bounds every length and never panics.
//! * [`segment`]: a directory of size-capped segment files, appended with one `write` per
//!   group of records and made durable with one `fdatasync`; the recovery scan (torn tails cut,
//!   corrupt records in the middle skipped and counted); deletion of whole segments. Its doc
//!   says why plain files on the core's thread rather than glommio's DMA files, and what the
//!   array will do with this (group commit, recovery, space reclamation: items 2, 4, 5).
//! * [`spare`]: segment files of zeros written and synced ahead of use by a helper thread, so
//!   that a commit's `fdatasync` overwrites blocks instead of growing a file (cheaper per sync).
pub mod record;
pub mod segment;
pub mod spare;
