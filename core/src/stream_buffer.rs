//! One execution's output buffer: bounded, shared by one producer (the engine) and any
//! number of subscribers, with backpressure from the slowest subscriber.
//!
//! - A chunk leaves the buffer when every subscriber has read it.
//! - With at least one subscriber, a push that does not fit waits: the engine stops
//!   reading the program's pipe and the program blocks on write. Backpressure
//!   reaches the child.
//! - With no subscriber, a push that does not fit evicts the oldest chunks, so a
//!   late subscriber gets what is still buffered and memory stays bounded.
//! - After [`StreamBuffer::close`], pushes fail with `STREAM_CLOSED` and subscribers
//!   drain what is left, then see the end.
//!
//! The core is synchronous and lock-protected through the loom shim; the loom model
//! in `tests/loom_stream.rs` checks the handoff and that no wakeup is lost.

use std::collections::VecDeque;
use std::task::{Context, Poll, Waker};

use crate::error::{Error, ErrorCode};
use crate::exec::{OutputChunk, StreamKind};

use crate::loom::sync::Mutex;

/// A subscriber's position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SubscriberId(u64);

#[derive(Debug)]
struct Sub {
    id: u64,
    /// Sequence number of the next chunk to read.
    cursor: u64,
    waker: Option<Waker>,
}

#[derive(Debug)]
struct State {
    /// Chunks with sequence numbers `first_seq..first_seq + chunks.len()`.
    chunks: VecDeque<OutputChunk>,
    first_seq: u64,
    bytes: usize,
    subs: Vec<Sub>,
    next_sub: u64,
    closed: bool,
    producer: Option<Waker>,
    /// Bytes evicted unread because nobody was subscribed.
    evicted_bytes: u64,
}

/// A bounded, multi-subscriber output buffer.
#[derive(Debug)]
pub struct StreamBuffer {
    state: Mutex<State>,
    max_bytes: usize,
}

fn lock(m: &Mutex<State>) -> impl std::ops::DerefMut<Target = State> + '_ {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl StreamBuffer {
    /// A buffer that holds at most `max_bytes` of unread output (one chunk larger
    /// than that is still accepted when the buffer is empty).
    pub fn new(max_bytes: usize) -> StreamBuffer {
        StreamBuffer {
            state: Mutex::new(State {
                chunks: VecDeque::new(),
                first_seq: 0,
                bytes: 0,
                subs: Vec::new(),
                next_sub: 0,
                closed: false,
                producer: None,
                evicted_bytes: 0,
            }),
            max_bytes,
        }
    }

    /// Bytes currently buffered.
    pub fn buffered_bytes(&self) -> usize {
        lock(&self.state).bytes
    }

    /// Current subscribers.
    pub fn subscribers(&self) -> usize {
        lock(&self.state).subs.len()
    }

    /// Bytes dropped unread because nobody was subscribed.
    pub fn evicted_bytes(&self) -> u64 {
        lock(&self.state).evicted_bytes
    }

    /// Whether the buffer was closed.
    pub fn is_closed(&self) -> bool {
        lock(&self.state).closed
    }

    /// Offers a chunk. `Ready(Ok)` when stored; `Pending` while subscribers have not
    /// made room (the waker is called when they do); `Ready(Err(STREAM_CLOSED))` after
    /// close. On `Pending` the chunk is handed back through `chunk` untouched.
    pub fn poll_push(
        &self,
        chunk: &mut Option<OutputChunk>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), Error>> {
        let mut s = lock(&self.state);
        if s.closed {
            return Poll::Ready(Err(Error::new(
                ErrorCode::StreamClosed,
                "the execution's output stream is closed; no more output is accepted",
            )));
        }
        let len = chunk.as_ref().map_or(0, |c| c.data.len());
        if s.subs.is_empty() {
            // Nobody to wait for: make room by dropping the oldest output.
            while !s.chunks.is_empty() && s.bytes + len > self.max_bytes {
                if let Some(old) = s.chunks.pop_front() {
                    s.bytes -= old.data.len();
                    s.evicted_bytes += old.data.len() as u64;
                    s.first_seq += 1;
                }
            }
        } else if !s.chunks.is_empty() && s.bytes + len > self.max_bytes {
            s.producer = Some(cx.waker().clone());
            return Poll::Pending;
        }
        if let Some(c) = chunk.take() {
            s.bytes += c.data.len();
            s.chunks.push_back(c);
        }
        let wakers: Vec<Waker> = s
            .subs
            .iter_mut()
            .filter_map(|sub| sub.waker.take())
            .collect();
        drop(s);
        for w in wakers {
            w.wake();
        }
        Poll::Ready(Ok(()))
    }

    /// Pushes a chunk, waiting for room (see [`StreamBuffer::poll_push`]).
    pub async fn push(&self, chunk: OutputChunk) -> Result<(), Error> {
        let mut slot = Some(chunk);
        std::future::poll_fn(|cx| self.poll_push(&mut slot, cx)).await
    }

    /// Adds a subscriber that starts at the oldest chunk still buffered.
    pub fn subscribe(&self) -> SubscriberId {
        let mut s = lock(&self.state);
        let id = s.next_sub;
        s.next_sub += 1;
        let cursor = s.first_seq;
        s.subs.push(Sub {
            id,
            cursor,
            waker: None,
        });
        SubscriberId(id)
    }

    /// Removes a subscriber; what only it still needed is dropped, which may let a
    /// waiting producer continue.
    pub fn unsubscribe(&self, sub: SubscriberId) {
        let mut s = lock(&self.state);
        s.subs.retain(|x| x.id != sub.0);
        let producer = self.trim(&mut s);
        drop(s);
        if let Some(w) = producer {
            w.wake();
        }
    }

    /// Reads the next output for `sub`: consecutive chunks of the same stream are
    /// joined up to `max_batch` bytes. `Ready(None)` at the end (closed and drained).
    pub fn poll_next(
        &self,
        sub: SubscriberId,
        max_batch: usize,
        cx: &mut Context<'_>,
    ) -> Poll<Option<OutputChunk>> {
        let mut s = lock(&self.state);
        let first_seq = s.first_seq;
        let end_seq = first_seq + s.chunks.len() as u64;
        let closed = s.closed;
        let Some(pos) = s.subs.iter().position(|x| x.id == sub.0) else {
            return Poll::Ready(None);
        };
        let cursor = s.subs[pos].cursor.max(first_seq);
        if cursor >= end_seq {
            if closed {
                return Poll::Ready(None);
            }
            s.subs[pos].waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let mut seq = cursor;
        let first = &s.chunks[(seq - first_seq) as usize];
        let stream: StreamKind = first.stream;
        let mut data = first.data.clone();
        seq += 1;
        while seq < end_seq {
            let next = &s.chunks[(seq - first_seq) as usize];
            if next.stream != stream || data.len() + next.data.len() > max_batch {
                break;
            }
            data.extend_from_slice(&next.data);
            seq += 1;
        }
        s.subs[pos].cursor = seq;
        let producer = self.trim(&mut s);
        drop(s);
        if let Some(w) = producer {
            w.wake();
        }
        Poll::Ready(Some(OutputChunk { stream, data }))
    }

    /// Reads the next output (see [`StreamBuffer::poll_next`]).
    pub async fn next(&self, sub: SubscriberId, max_batch: usize) -> Option<OutputChunk> {
        std::future::poll_fn(|cx| self.poll_next(sub, max_batch, cx)).await
    }

    /// Ends the stream: later pushes fail, subscribers drain and then end.
    pub fn close(&self) {
        let mut s = lock(&self.state);
        s.closed = true;
        let wakers: Vec<Waker> = s
            .subs
            .iter_mut()
            .filter_map(|sub| sub.waker.take())
            .collect();
        let producer = s.producer.take();
        drop(s);
        for w in wakers.into_iter().chain(producer) {
            w.wake();
        }
    }

    /// Drops chunks every subscriber has read; returns the producer's waker if room
    /// was made.
    fn trim(&self, s: &mut State) -> Option<Waker> {
        if s.subs.is_empty() {
            // Keep buffered output for late subscribers; eviction happens on push.
            return s.producer.take();
        }
        let min = s.subs.iter().map(|x| x.cursor).min().unwrap_or(s.first_seq);
        let mut freed = false;
        while s.first_seq < min {
            match s.chunks.pop_front() {
                Some(c) => {
                    s.bytes -= c.data.len();
                    s.first_seq += 1;
                    freed = true;
                }
                None => break,
            }
        }
        if freed {
            s.producer.take()
        } else {
            None
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn chunk(s: &str) -> OutputChunk {
        OutputChunk {
            stream: StreamKind::Stdout,
            data: s.as_bytes().to_vec(),
        }
    }

    #[tokio::test]
    async fn late_subscriber_gets_what_is_buffered_and_memory_is_bounded() {
        let b = StreamBuffer::new(8);
        for s in ["aaaa", "bbbb", "cccc"] {
            b.push(chunk(s)).await.unwrap();
        }
        assert_eq!(b.buffered_bytes(), 8);
        assert_eq!(b.evicted_bytes(), 4);
        let sub = b.subscribe();
        assert_eq!(b.next(sub, 1024).await.unwrap().data, b"bbbbcccc");
        b.close();
        assert!(b.next(sub, 1024).await.is_none());
        assert_eq!(
            b.push(chunk("x")).await.unwrap_err().code,
            ErrorCode::StreamClosed
        );
    }

    #[tokio::test]
    async fn a_slow_subscriber_holds_the_producer_back() {
        let b = std::sync::Arc::new(StreamBuffer::new(4));
        let sub = b.subscribe();
        b.push(chunk("1234")).await.unwrap();
        let producer = {
            let b = b.clone();
            tokio::spawn(async move { b.push(chunk("5678")).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
        assert!(
            !producer.is_finished(),
            "the push should wait for the reader"
        );
        assert_eq!(b.buffered_bytes(), 4);
        assert_eq!(b.next(sub, 2).await.unwrap().data, b"1234");
        producer.await.unwrap().unwrap();
        assert_eq!(b.next(sub, 100).await.unwrap().data, b"5678");
        // Unsubscribing the only reader releases a waiting producer too.
        b.push(chunk("abcd")).await.unwrap();
        let producer = {
            let b = b.clone();
            tokio::spawn(async move { b.push(chunk("efgh")).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
        assert!(!producer.is_finished());
        b.unsubscribe(sub);
        producer.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn batches_join_same_stream_chunks_only() {
        let b = StreamBuffer::new(1024);
        let sub = b.subscribe();
        b.push(chunk("a")).await.unwrap();
        b.push(chunk("b")).await.unwrap();
        b.push(OutputChunk {
            stream: StreamKind::Stderr,
            data: b"e".to_vec(),
        })
        .await
        .unwrap();
        let first = b.next(sub, 1024).await.unwrap();
        assert_eq!(
            (first.stream, first.data),
            (StreamKind::Stdout, b"ab".to_vec())
        );
        let second = b.next(sub, 1024).await.unwrap();
        assert_eq!(
            (second.stream, second.data),
            (StreamKind::Stderr, b"e".to_vec())
        );
    }
}

#[cfg(all(test, loom))]
#[path = "tests/loom_stream.rs"]
mod loom_stream;
