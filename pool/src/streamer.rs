//! The streamer actor: the registry of per-execution output buffers.
//!
//! The supervisor opens a buffer when an execution is accepted and hands it to the
//! engine as the output sink; subscribers (the `Paddock` handle's `execute_stream`,
//! HTTP streaming) subscribe by execution id — before the execution starts, or late,
//! in which case they get what is still buffered. A finished execution's buffer
//! lingers for a while for late subscribers, then is dropped. The number of open
//! buffers is capped, and so are the bytes finished buffers hold while they linger
//! (the oldest goes first; a subscriber already reading it keeps it), so the registry
//! never grows without bound.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use async_trait::async_trait;
use paddock_core::{Error, ErrorCode, ExecutionId, OutputChunk, OutputSink};

use paddock_core::stream_buffer::{StreamBuffer, SubscriberId};

/// Settings of the streamer.
#[derive(Debug, Clone)]
pub struct StreamerConfig {
    /// Unread bytes buffered per execution before the engine is slowed down.
    pub buffer_bytes: usize,
    /// Largest batch a subscriber receives at once.
    pub flush_bytes: usize,
    /// How long a finished execution's output stays available to late subscribers.
    pub linger: Duration,
    /// Most buffers open at once.
    pub max_streams: usize,
    /// Most output finished buffers hold while they linger, in bytes.
    pub max_lingering_bytes: usize,
}

impl Default for StreamerConfig {
    fn default() -> Self {
        StreamerConfig {
            buffer_bytes: 256 << 10,
            flush_bytes: 64 << 10,
            linger: Duration::from_secs(10),
            max_streams: 100_000,
            max_lingering_bytes: 64 << 20,
        }
    }
}

/// The streamer actor.
#[derive(Debug)]
pub struct Streamer {
    config: StreamerConfig,
    streams: HashMap<ExecutionId, Arc<StreamBuffer>>,
    /// Closed streams in closing order, with the time they may be dropped. One
    /// periodic sweep drops them (a timer per stream would make every message cost
    /// time proportional to the number of lingering streams).
    /// Each with the bytes it held when it closed.
    lingering: std::collections::VecDeque<(std::time::Instant, ExecutionId, usize)>,
    /// The sum of those bytes.
    lingering_bytes: usize,
    /// Recently finished executions whose buffers are gone (nothing was left to
    /// read), so a late subscriber sees the end at once instead of waiting.
    ended: std::collections::VecDeque<ExecutionId>,
    ended_set: std::collections::HashSet<ExecutionId>,
}

impl Streamer {
    /// A streamer with the given settings.
    pub fn new(config: StreamerConfig) -> Streamer {
        Streamer {
            config,
            streams: HashMap::new(),
            lingering: std::collections::VecDeque::new(),
            lingering_bytes: 0,
            ended: std::collections::VecDeque::new(),
            ended_set: std::collections::HashSet::new(),
        }
    }
}

impl Streamer {
    fn remember_ended(&mut self, id: ExecutionId) {
        if self.ended.len() >= self.config.max_streams {
            if let Some(old) = self.ended.pop_front() {
                self.ended_set.remove(&old);
            }
        }
        if self.ended_set.insert(id.clone()) {
            self.ended.push_back(id);
        }
    }

    /// Drops the oldest lingering stream; false when none lingers.
    fn drop_oldest_lingering(&mut self) -> bool {
        let Some((_, id, bytes)) = self.lingering.pop_front() else {
            return false;
        };
        self.lingering_bytes -= bytes;
        self.streams.remove(&id);
        self.remember_ended(id);
        true
    }

    /// Drops closed streams whose linger period has passed.
    fn sweep(&mut self, now: std::time::Instant) {
        while self.lingering.front().is_some_and(|(at, _, _)| *at <= now) {
            self.drop_oldest_lingering();
        }
    }
}

impl Actor for Streamer {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(4096);
        let every =
            (self.config.linger / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        ctx.run_interval(every, |act, _| act.sweep(std::time::Instant::now()));
    }
}

/// Opens (or returns the already opened) buffer of an execution.
#[derive(Debug, Message)]
#[rtype(result = "Result<Arc<StreamBuffer>, Error>")]
pub struct OpenStream(pub ExecutionId);

impl Handler<OpenStream> for Streamer {
    type Result = Result<Arc<StreamBuffer>, Error>;

    fn handle(&mut self, msg: OpenStream, _ctx: &mut Self::Context) -> Self::Result {
        if let Some(b) = self.streams.get(&msg.0) {
            return Ok(b.clone());
        }
        if self.ended_set.contains(&msg.0) {
            // Finished and fully gone: an already-ended, empty stream.
            let b = Arc::new(StreamBuffer::new(0));
            b.close();
            return Ok(b);
        }
        if self.streams.len() >= self.config.max_streams {
            // Make room from finished streams first, oldest first.
            if !self.drop_oldest_lingering() {
                return Err(Error::new(
                    ErrorCode::PoolExhausted,
                    format!(
                        "{} output streams are open; wait for executions to finish",
                        self.config.max_streams
                    ),
                )
                .with_retry_after_ms(100));
            }
        }
        let b = Arc::new(StreamBuffer::new(self.config.buffer_bytes));
        self.streams.insert(msg.0, b.clone());
        Ok(b)
    }
}

/// Subscribes to an execution's output, opening its buffer if the execution has not
/// started yet.
#[derive(Debug, Message)]
#[rtype(result = "Result<Subscription, Error>")]
pub struct Subscribe(pub ExecutionId);

impl Handler<Subscribe> for Streamer {
    type Result = Result<Subscription, Error>;

    fn handle(&mut self, msg: Subscribe, ctx: &mut Self::Context) -> Self::Result {
        let buffer = self.handle(OpenStream(msg.0), ctx)?;
        let id = buffer.subscribe();
        Ok(Subscription {
            buffer,
            id,
            flush_bytes: self.config.flush_bytes,
        })
    }
}

/// Closes an execution's buffer; it stays readable for the linger period.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct CloseStream(pub ExecutionId);

impl Handler<CloseStream> for Streamer {
    type Result = ();

    fn handle(&mut self, msg: CloseStream, _ctx: &mut Self::Context) {
        if let Some(b) = self.streams.get(&msg.0) {
            b.close();
            if b.buffered_bytes() == 0 && b.subscribers() == 0 {
                // Nothing left for anyone: drop it now, remember that it ended.
                self.streams.remove(&msg.0);
                self.remember_ended(msg.0);
            } else {
                let bytes = b.buffered_bytes();
                self.lingering.push_back((
                    std::time::Instant::now() + self.config.linger,
                    msg.0,
                    bytes,
                ));
                self.lingering_bytes += bytes;
                while self.lingering_bytes > self.config.max_lingering_bytes
                    && self.drop_oldest_lingering()
                {}
            }
        }
    }
}

/// How many buffers are open.
#[derive(Debug, Message)]
#[rtype(result = "usize")]
pub struct OpenStreams;

impl Handler<OpenStreams> for Streamer {
    type Result = usize;

    fn handle(&mut self, _msg: OpenStreams, _ctx: &mut Self::Context) -> usize {
        self.streams.len()
    }
}

/// A subscriber's handle on one execution's output. Dropping it unsubscribes.
#[derive(Debug)]
pub struct Subscription {
    buffer: Arc<StreamBuffer>,
    id: SubscriberId,
    flush_bytes: usize,
}

impl Subscription {
    /// The next batch of output, or `None` once the execution's output has ended.
    pub async fn next(&mut self) -> Option<OutputChunk> {
        self.buffer.next(self.id, self.flush_bytes).await
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.buffer.unsubscribe(self.id);
    }
}

/// The engine-facing side of a buffer: pushes wait for room (backpressure); after
/// close they fail with `STREAM_CLOSED`.
#[derive(Debug, Clone)]
pub struct BufferSink(pub Arc<StreamBuffer>);

#[async_trait]
impl OutputSink for BufferSink {
    async fn chunk(&self, chunk: OutputChunk) -> Result<(), Error> {
        self.0.push(chunk).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_core::StreamKind;

    fn chunk(n: usize) -> OutputChunk {
        OutputChunk {
            stream: StreamKind::Stdout,
            data: vec![b'x'; n],
        }
    }

    #[actix::test]
    async fn lingering_output_is_bounded_in_bytes_oldest_first() {
        let streamer = Streamer::new(StreamerConfig {
            linger: Duration::from_secs(60),
            max_lingering_bytes: 100,
            ..StreamerConfig::default()
        })
        .start();
        let ids: Vec<ExecutionId> = (0..3).map(|_| ExecutionId::new()).collect();
        for id in &ids {
            let buffer = streamer
                .send(OpenStream(id.clone()))
                .await
                .unwrap()
                .unwrap();
            buffer.push(chunk(40)).await.unwrap();
            streamer.send(CloseStream(id.clone())).await.unwrap();
        }
        // 3 × 40 bytes against a cap of 100: the oldest went, the others stay.
        assert_eq!(streamer.send(OpenStreams).await.unwrap(), 2);
        let mut late = streamer
            .send(Subscribe(ids[0].clone()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(late.next().await, None, "the oldest buffer was dropped");
        let mut late = streamer
            .send(Subscribe(ids[2].clone()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(late.next().await.map(|c| c.data.len()), Some(40));
        assert_eq!(late.next().await, None);
    }
}
