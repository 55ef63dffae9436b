//! Loom model: cancellation racing completion leaves exactly one terminal state, and a
//! waiter registered before the cancel is always woken.

use super::*;
use loom::thread;

#[test]
fn cancel_races_finish_exactly_one_wins() {
    loom::model(|| {
        let token = CancelToken::new();
        let canceller = {
            let token = token.clone();
            thread::spawn(move || token.cancel())
        };
        let finished = token.finish();
        let cancelled = canceller.join().unwrap();
        assert!(finished ^ cancelled, "exactly one transition must win");
        let expected = if finished {
            TokenState::Finished
        } else {
            TokenState::Cancelled
        };
        assert_eq!(token.state(), expected);
    });
}

#[test]
fn waiter_is_never_lost() {
    loom::model(|| {
        let token = CancelToken::new();
        let canceller = {
            let token = token.clone();
            thread::spawn(move || {
                token.cancel();
            })
        };
        loom::future::block_on(token.cancelled());
        assert!(token.is_cancelled());
        canceller.join().unwrap();
    });
}
