//! Loom model: a producer pushing into a full buffer and a subscriber reading race;
//! the producer is always woken and every byte arrives exactly once, in order.

use super::*;
use crate::loom::sync::Arc;
use loom::thread;

#[test]
fn backpressure_handoff_loses_nothing() {
    loom::model(|| {
        let buf = Arc::new(StreamBuffer::new(1));
        let sub = buf.subscribe();
        let producer = {
            let buf = buf.clone();
            thread::spawn(move || {
                for b in [b'a', b'b'] {
                    loom::future::block_on(buf.push(OutputChunk {
                        stream: StreamKind::Stdout,
                        data: vec![b],
                    }))
                    .unwrap();
                }
                buf.close();
            })
        };
        let mut got = Vec::new();
        while let Some(c) = loom::future::block_on(buf.next(sub, 16)) {
            got.extend(c.data);
        }
        producer.join().unwrap();
        assert_eq!(got, b"ab");
        assert_eq!(buf.buffered_bytes(), 0);
    });
}
