//! An actix actor that drives Paddock by messages.
//!
//! `ToolRunner` receives `RunTool` messages (say, from an agent loop), turns each into
//! an `Execute` for the supervisor and answers with the tool's stdout. It is started
//! on the supervisor's own arbiter, so every message stays on one thread.
//!
//! Run it with `cargo run -p paddock --example actor_client`.

use actix::prelude::*;
use paddock_core::{Error, ExecRequest, Language, Program};
use paddock_pool::{Execute, Supervisor};

/// Runs a snippet of Python as a tool call.
#[derive(Message)]
#[rtype(result = "Result<String, Error>")]
struct RunTool {
    code: String,
}

struct ToolRunner {
    supervisor: Addr<Supervisor>,
    calls: u32,
}

impl Actor for ToolRunner {
    type Context = Context<Self>;
}

impl Handler<RunTool> for ToolRunner {
    type Result = ResponseFuture<Result<String, Error>>;

    fn handle(&mut self, msg: RunTool, _ctx: &mut Context<Self>) -> Self::Result {
        self.calls += 1;
        let supervisor = self.supervisor.clone();
        Box::pin(async move {
            let request =
                ExecRequest::new(Program::code(Language::Python, msg.code)).with_timeout_ms(10_000);
            // `send`, not `do_send`: a full mailbox is an answer, never an unbounded queue.
            let result = supervisor.send(Execute::new(request)).await.map_err(|e| {
                Error::new(paddock_core::ErrorCode::EngineDisposed, e.to_string())
            })??;
            Ok(result.stdout)
        })
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let paddock = paddock::builder().start()?;
    let supervisor = paddock.supervisor();
    let runner = ToolRunner::start_in_arbiter(&paddock.arbiter(), move |_| ToolRunner {
        supervisor,
        calls: 0,
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let out = runner
            .send(RunTool {
                code: "print(sum(range(10)))".into(),
            })
            .await??;
        println!("tool said: {}", out.trim());
        paddock.shutdown(std::time::Duration::from_secs(5)).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
}
