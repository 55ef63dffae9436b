//! Closing an upgraded connection (a WebSocket) promptly when the server's side ends.
//!
//! When the body of an answer to an upgrade ends, actix's HTTP/1 dispatcher waits up
//! to `server.close_linger_ms` for the client to close before it closes the
//! connection itself. It reckons that deadline from a clock it refreshes only every
//! half second, so the deadline can already be past when it is set; its timer then
//! registers no wake-up, and nothing polls the connection again until the client
//! does something. A client that waits for the server to close after the close
//! handshake (as RFC 6455 has it) waits out its own timeout. [`wake_at_end`] wakes
//! the connection once more, after the linger, so that it closes on time.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::body::{BodySize, BoxBody, MessageBody};
use actix_web::HttpResponse;
use bytes::Bytes;

/// `response` (an answer to an upgrade) with a body that, when it ends, wakes the
/// connection again `linger` (plus a little) later.
pub fn wake_at_end(response: HttpResponse, linger: Duration) -> HttpResponse {
    response
        .map_body(|_, body| {
            WakeAtEnd {
                body,
                linger,
                woken: false,
            }
            .boxed()
        })
        .map_into_boxed_body()
}

struct WakeAtEnd {
    body: BoxBody,
    linger: Duration,
    woken: bool,
}

impl MessageBody for WakeAtEnd {
    type Error = Box<dyn std::error::Error>;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let next = Pin::new(&mut self.body).poll_next(cx);
        if let Poll::Ready(None) = next {
            if !std::mem::replace(&mut self.woken, true) {
                let waker = cx.waker().clone();
                let after = self.linger + Duration::from_millis(20);
                actix_web::rt::spawn(async move {
                    tokio::time::sleep(after).await;
                    waker.wake();
                });
            }
        }
        next
    }
}
