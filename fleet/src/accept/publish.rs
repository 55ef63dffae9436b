//! Publishing an order on its engine's work queue, retried with the same message
//! id while the cluster fails over, and the refusals a publish can end in.

use std::time::Duration;

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use paddock_core::{EngineName, Error, ErrorCode, ExecutionId};

use super::fencing::served;
use super::Federated;
use crate::store::unavailable;

impl Federated {
    /// Publishes execution `id`'s order (`payload`) on engine `engine`'s work
    /// queue, again with the same message id while the cluster fails over (the
    /// stream keeps one).
    pub(super) async fn publish(
        &self,
        id: &ExecutionId,
        engine: &EngineName,
        payload: bytes::Bytes,
    ) -> Result<(), Error> {
        let inner = &self.inner;
        let subject = inner.cx.names.work_subject(engine);
        let deadline = tokio::time::Instant::now()
            + Duration::from_millis(inner.cx.config.queue_timeout_ms.min(30_000));
        let mut pause = Duration::from_millis(50);
        loop {
            let sent = inner
                .cx
                .js
                .send_publish(
                    subject.clone(),
                    PublishMessage::build()
                        .payload(payload.clone())
                        .message_id(id.to_string()),
                )
                .await;
            let result = match sent {
                Ok(ack) => ack.await.map(|_| ()),
                Err(e) => Err(e),
            };
            let e = match result {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            let text = e.to_string();
            // "No stream" is also what a stream electing its leader answers: only a
            // stream that is not there at all means that no node runs the engine.
            if e.kind() == PublishErrorKind::StreamNotFound && !self.stream_exists(engine).await {
                return Err(Error::new(
                    ErrorCode::CapabilityNotSupported,
                    format!("no node of the fleet runs engine `{engine}`; see GET /v1/fleet"),
                ));
            }
            if text.contains("maximum messages") || text.contains("maximum bytes") {
                return Err(Error::new(
                    ErrorCode::PoolExhausted,
                    format!(
                        "engine `{engine}`'s work queue is full (fleet.max_queued); retry later"
                    ),
                )
                .with_retry_after_ms(1_000));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(unavailable("queueing the execution", e));
            }
            tracing::debug!(%id, error = %e, "queueing; retrying");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// Whether engine `engine`'s work stream exists (or may: a cluster that does
    /// not answer is given the benefit of the doubt, and retried).
    async fn stream_exists(&self, engine: &EngineName) -> bool {
        let inner = &self.inner;
        if served(inner, engine) {
            return true;
        }
        match inner
            .cx
            .js
            .get_stream(inner.cx.names.work_stream(engine))
            .await
        {
            Ok(_) => true,
            Err(e) => !e.to_string().contains("not found"),
        }
    }
}
