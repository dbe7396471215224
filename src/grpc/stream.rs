//! A server stream fed by a channel, holding a guard that releases the stream's array resources
//! (subscriptions, responders, sinks) when the client goes away and tonic drops the stream.
use futures_lite::Stream;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;
use tonic::Status;

/// Yields what arrives on `rx`, mapped by `map`, until every sender is gone.
pub struct ChannelStream<T, U, G> {
    rx: mpsc::Receiver<T>,
    map: fn(T) -> Result<U, Status>,
    _guard: G,
}

impl<T, U, G> ChannelStream<T, U, G> {
    pub fn new(rx: mpsc::Receiver<T>, map: fn(T) -> Result<U, Status>, guard: G) -> Self {
        ChannelStream { rx, map, _guard: guard }
    }
}

impl<T, U, G: Unpin> Stream for ChannelStream<T, U, G> {
    type Item = Result<U, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        this.rx.poll_recv(cx).map(|item| item.map(this.map))
    }
}

/// The same over a core's [`Mailbox`](crate::mesh::msg::Mailbox) (unbounded), with a mapping
/// that may keep state.
pub struct MailboxStream<T: 'static, U, G> {
    rx: flume::r#async::RecvStream<'static, T>,
    map: Box<dyn FnMut(T) -> Result<U, Status> + Send>,
    _guard: G,
}

impl<T, U, G> MailboxStream<T, U, G> {
    pub fn new(rx: flume::Receiver<T>, map: Box<dyn FnMut(T) -> Result<U, Status> + Send>, guard: G) -> Self {
        MailboxStream { rx: rx.into_stream(), map, _guard: guard }
    }
}

impl<T, U, G: Unpin> Stream for MailboxStream<T, U, G> {
    type Item = Result<U, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        Pin::new(&mut this.rx).poll_next(cx).map(|item| item.map(&mut this.map))
    }
}
