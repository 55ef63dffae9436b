//! Closing an upgraded connection (a WebSocket) promptly when the server's side
//! ends, and noticing a client that went away while its answer is silent.
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
        .map_body(|_, body| waking(body, linger))
        .map_into_boxed_body()
}

/// `body`, waking its connection again `linger` (plus a little) after it ends: for
/// any answer after which actix lingers before closing (an upgrade's, or one given
/// before the request's body was read).
pub(super) fn waking(body: BoxBody, linger: Duration) -> BoxBody {
    WakeAtEnd {
        body,
        linger,
        woken: false,
    }
    .boxed()
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

/// A copy of a connection's socket, kept in its extensions (see
/// [`remember_socket`]).
#[derive(Clone)]
struct ClientSocket(std::sync::Arc<std::net::TcpStream>);

/// Keeps a copy of every accepted connection's socket (plain or TLS) in its
/// extensions, for [`client_gone`], and returns it (for shutting the connection down
/// from elsewhere, see `connections`).
pub(super) fn remember_socket(
    conn: &dyn std::any::Any,
    ext: &mut actix_web::dev::Extensions,
) -> Option<std::sync::Arc<std::net::TcpStream>> {
    use actix_web::rt::net::TcpStream;
    use std::os::fd::AsFd;
    let tcp = conn.downcast_ref::<TcpStream>().or_else(|| {
        conn.downcast_ref::<actix_tls::accept::rustls_0_23::TlsStream<TcpStream>>()
            .map(|tls| tls.get_ref().0)
    });
    // A copy of the descriptor (non-blocking already: the flag is the socket's).
    let copy = tcp.and_then(|t| t.as_fd().try_clone_to_owned().ok())?;
    let copy = std::sync::Arc::new(std::net::TcpStream::from(copy));
    ext.insert(ClientSocket(copy.clone()));
    Some(copy)
}

/// How often [`client_gone`] looks at the socket.
const GONE_CHECK: Duration = Duration::from_millis(250);

/// Resolves once the client of `req`'s connection has closed it (or it broke),
/// found by peeking at the socket every 250 ms: a client waiting for an answer
/// sends nothing, so end of stream means it left. For answers that stay silent for
/// long (an execution that prints nothing), whose client's departure no write would
/// show. `None` when the connection's socket is not known.
pub fn client_gone(
    req: &actix_web::HttpRequest,
) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
    let socket = req.conn_data::<ClientSocket>()?.clone();
    Some(async move {
        let mut every = tokio::time::interval(GONE_CHECK);
        loop {
            every.tick().await;
            let mut byte = [0u8; 1];
            let gone = match socket.0.peek(&mut byte) {
                Ok(n) => n == 0,
                Err(e) => !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ),
            };
            if gone {
                return;
            }
        }
    })
}
