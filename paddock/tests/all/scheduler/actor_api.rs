//! The message API, driven by an actor on the supervisor's own arbiter.

use std::time::Duration;

use actix::prelude::*;
use paddock_core::{Error, ErrorCode, ExecRequest, ExecResult, Program};
use paddock_pool::{Cancel, Execute, GetStats, Supervisor};

struct Client {
    supervisor: Addr<Supervisor>,
}

impl Actor for Client {
    type Context = Context<Self>;
}

#[derive(Message)]
#[rtype(result = "Result<ExecResult, Error>")]
struct Run(ExecRequest);

impl Handler<Run> for Client {
    type Result = ResponseFuture<Result<ExecResult, Error>>;

    fn handle(&mut self, msg: Run, _ctx: &mut Context<Self>) -> Self::Result {
        let supervisor = self.supervisor.clone();
        Box::pin(async move {
            supervisor
                .send(Execute::new(msg.0))
                .await
                .map_err(|e| Error::new(ErrorCode::EngineDisposed, e.to_string()))?
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actor_drives_paddock_by_messages() {
    let paddock = paddock::builder().start().unwrap();
    let supervisor = paddock.supervisor();
    let sup = supervisor.clone();
    let client = Client::start_in_arbiter(&paddock.arbiter(), move |_| Client { supervisor: sup });
    let r = client
        .send(Run(ExecRequest::new(Program::command([
            "echo",
            "from an actor",
        ]))))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.stdout, "from an actor\n");

    // Cancel by message while it runs.
    let req = ExecRequest::new(Program::command(["sleep", "30"]));
    let id = req.id.clone();
    let pending = client.send(Run(req));
    let canceller = async {
        for _ in 0..200 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            if supervisor
                .send(Cancel {
                    caller: paddock_pool::Caller::Embedder,
                    id: id.clone(),
                })
                .await
                .unwrap()
            {
                return true;
            }
        }
        false
    };
    let (r, cancelled) = tokio::join!(pending, canceller);
    assert!(cancelled);
    assert_eq!(
        r.unwrap().unwrap().outcome,
        paddock_core::Outcome::Cancelled
    );
    let stats = supervisor
        .send(GetStats {
            caller: paddock_pool::Caller::Embedder,
        })
        .await
        .unwrap();
    assert_eq!(stats.accepted_total.unwrap_or_default(), 2);
    assert_eq!(stats.in_flight, 0);
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}
