//! Frame writer: appends one server frame to an output buffer, escaping per version and
//! dropping headers the negotiated version cannot represent (seed 000's table).
use super::frame::{Command, Version};
use bytes::BytesMut;

pub struct FrameWriter<'a> {
    buf: &'a mut BytesMut,
    version: Version,
    escape: bool,
    dropped: u32,
}

impl<'a> FrameWriter<'a> {
    /// Starts a frame: writes the command line.
    pub fn begin(buf: &'a mut BytesMut, version: Version, command: Command) -> Self {
        let _ = command;
        FrameWriter { buf, version, escape: true, dropped: 0 }
    }
    /// Appends one header, escaped for the version; drops it (and counts the drop) if the
    /// version cannot represent it. The caller never writes `content-length`.
    pub fn header(&mut self, name: &[u8], value: &[u8]) {
        let _ = (name, value, &self.buf, self.version, self.escape);
        todo!("codec helper")
    }
    /// Stamps `content-length`, the blank line, the body and the NUL. Returns the number of
    /// headers dropped as unrepresentable.
    pub fn finish(self, body: &[u8]) -> u32 {
        let _ = body;
        self.dropped
    }
}
