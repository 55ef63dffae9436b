//! Reading request bodies within time.
//!
//! Every request's body is read through [`time_bodies`]: while a handler waits for
//! the body, `server.body_read_timeout_ms` may pass without a byte arriving, and no
//! more; then the read ends with an error that [`is_body_timeout`] recognises and
//! readers answer 408 (`TIMEOUT` on the native API), and the connection is closed
//! after the answer. The clock runs only while the body is being read, and starts
//! again with each piece that arrives, so a slow but steady upload is not cut.
//!
//! Streams that are long-lived by design are not bounded: WebSocket upgrades (their
//! "body" is the socket), and what a surface exempts with [`lift_body_timeout`] (the
//! E2B agent's Connect client streams).

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::error::PayloadError;
use actix_web::http::{header, ConnectionType, Method};
use actix_web::middleware::Next;
use actix_web::{web, HttpMessage, HttpRequest};
use bytes::Bytes;
use futures_util::Stream;

use super::State;

/// What a request's payload can be made of.
type BoxedStream = Pin<Box<dyn Stream<Item = Result<Bytes, PayloadError>>>>;

/// What a request's body clock knows: whether it was lifted, and whether it ran out.
#[derive(Debug, Clone, Default)]
struct BodyClock(Rc<Flags>);

#[derive(Debug, Default)]
struct Flags {
    lifted: Cell<bool>,
    expired: Cell<bool>,
    /// The body was read to its end.
    finished: Cell<bool>,
}

/// The error a body read ends with when the body stalled.
#[derive(Debug)]
struct BodyStalled {
    ms: u64,
}

impl std::fmt::Display for BodyStalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no byte of the request body arrived for {} ms (server.body_read_timeout_ms); send the body without pauses",
            self.ms
        )
    }
}

impl std::error::Error for BodyStalled {}

/// Whether `error` is the end of a body that stalled past
/// `server.body_read_timeout_ms` (its `Display` says so, for the answer).
pub fn is_body_timeout(error: &PayloadError) -> bool {
    matches!(error, PayloadError::Io(e) if e.get_ref().is_some_and(|inner| inner.is::<BodyStalled>()))
}

/// Lifts the body read timeout of `req`, for a route whose body is a long-lived
/// stream of the client's (an E2B Connect client stream, whose client may stay
/// silent for as long as it likes). Call it before the body is read.
pub fn lift_body_timeout(req: &HttpRequest) {
    if let Some(clock) = req.extensions().get::<BodyClock>() {
        clock.0.lifted.set(true);
    }
}

/// A WebSocket handshake: its "body" is the socket for as long as it lives.
fn is_websocket(req: &ServiceRequest) -> bool {
    req.method() == Method::GET
        && req.head().upgrade()
        && req
            .headers()
            .get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// Whether `req` announces a body (a length above 0, or chunks).
fn announces_body(req: &ServiceRequest) -> bool {
    let headers = req.headers();
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0")
}

/// Middleware: reads every request's body (but a WebSocket's) through a clock of
/// `server.body_read_timeout_ms`, and closes the connection after answering a
/// request whose body ran out of time.
///
/// An answer given before the body was read whole (a 401, a 413, a 408) is followed
/// by actix's linger (`server.close_linger_ms`), whose timer may register no
/// wake-up (see `closing`): such an answer's end wakes the connection again after
/// the linger, so that it closes then rather than whenever the client next sends.
pub(super) async fn time_bodies(
    mut req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let (idle, linger) = match req.app_data::<web::Data<State>>() {
        Some(s) => (Some(s.config.body_read_timeout_ms), s.close_linger()),
        None => (None, Duration::ZERO),
    };
    let announced = announces_body(&req);
    let mut clock = None;
    if let Some(ms) = idle.filter(|_| !is_websocket(&req)) {
        let c = BodyClock::default();
        req.extensions_mut().insert(c.clone());
        let payload = req.take_payload();
        let timed: BoxedStream = Box::pin(Timed {
            inner: payload,
            ms,
            sleep: None,
            clock: c.clone(),
            done: false,
        });
        req.set_payload(Payload::from(timed));
        clock = Some(c);
    }
    let mut response = next.call(req).await?;
    let Some(clock) = clock else {
        return Ok(response.map_into_boxed_body());
    };
    if clock.0.expired.get() {
        // The rest of the body may still come, or never: the connection ends with
        // this answer rather than waiting to read it.
        response
            .response_mut()
            .head_mut()
            .set_connection_type(ConnectionType::Close);
    }
    if announced && !clock.0.finished.get() {
        return Ok(response.map_body(|_, body| super::closing::waking(BoxBody::new(body), linger)));
    }
    Ok(response.map_into_boxed_body())
}

/// A body read against the clock.
struct Timed {
    inner: Payload,
    ms: u64,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    clock: BodyClock,
    done: bool,
}

impl Stream for Timed {
    type Item = Result<Bytes, PayloadError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_next(cx) {
            Poll::Ready(Some(Ok(chunk))) => {
                // A piece arrived: the clock starts again.
                let deadline = tokio::time::Instant::now() + Duration::from_millis(self.ms);
                if let Some(sleep) = self.sleep.as_mut() {
                    sleep.as_mut().reset(deadline);
                }
                Poll::Ready(Some(Ok(chunk)))
            }
            Poll::Ready(None) => {
                self.done = true;
                self.clock.0.finished.set(true);
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Pending => {
                if self.clock.0.lifted.get() {
                    return Poll::Pending;
                }
                let ms = self.ms;
                let sleep = self
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(Duration::from_millis(ms))));
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.done = true;
                self.clock.0.expired.set(true);
                Poll::Ready(Some(Err(PayloadError::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    BodyStalled { ms },
                )))))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    /// A body fed through a channel, and its feeding end.
    fn body(ms: u64, clock: BodyClock) -> (tokio::sync::mpsc::Sender<Bytes>, Timed) {
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
        let chunks = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|b| (Ok(b), rx))
        });
        let inner: BoxedStream = Box::pin(chunks);
        let timed = Timed {
            inner: Payload::from(inner),
            ms,
            sleep: None,
            clock,
            done: false,
        };
        (tx, timed)
    }

    #[actix_web::test]
    async fn a_stalled_body_ends_with_the_timeout_and_a_lifted_one_waits() {
        let clock = BodyClock::default();
        let (tx, mut timed) = body(50, clock.clone());
        tx.send(Bytes::from_static(b"{")).await.unwrap();
        assert_eq!(
            timed.next().await.unwrap().unwrap(),
            Bytes::from_static(b"{")
        );
        let e = timed.next().await.unwrap().unwrap_err();
        assert!(is_body_timeout(&e), "{e}");
        assert!(e.to_string().contains("server.body_read_timeout_ms"), "{e}");
        assert!(clock.0.expired.get());
        assert!(timed.next().await.is_none(), "nothing after the timeout");
        drop(tx);

        // Lifted: it waits as long as the sender does.
        let clock = BodyClock::default();
        clock.0.lifted.set(true);
        let (tx, mut timed) = body(20, clock.clone());
        let late = async move {
            tokio::time::sleep(Duration::from_millis(120)).await;
            tx.send(Bytes::from_static(b"x")).await.unwrap();
        };
        let (read, ()) = futures_util::join!(timed.next(), late);
        assert_eq!(read.unwrap().unwrap(), Bytes::from_static(b"x"));
        assert!(
            timed.next().await.is_none(),
            "the sender is gone: the body ended"
        );
        assert!(!clock.0.expired.get());
        assert!(!is_body_timeout(&PayloadError::Incomplete(None)));
    }
}
