//! The output cap.

use std::time::Duration;

use paddock_core::{LimitKind, Outcome};

use crate::case::{clip, Check, Stop};
use crate::context::{brief, exec, sh, Ctx};

/// The cap the case asks for.
const CAP: usize = 1_000;
/// Room for the truncation marker an engine may append.
const MARKER_ROOM: usize = 256;

pub(crate) async fn output_is_capped(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let mut request = sh(
        "yes a | head -c 1000000; yes b | head -c 1000000 >&2; echo finished > done.marker",
        &[],
    );
    request.limits.max_output_bytes = Some(CAP as u64);
    let r = tokio::time::timeout(Duration::from_secs(20), exec(&*sandbox, request))
        .await
        .map_err(|_| {
            Stop::Fail("writing 2 MB under a 1000-byte cap took more than 20 s".into())
        })??;
    ensure!(
        r.is_success()
            || r.outcome
                == (Outcome::LimitExceeded {
                    limit: LimitKind::Output
                }),
        "a program writing past the output cap must complete (or end as LimitExceeded(output) \
         when the engine kills on the cap); got {}",
        brief(&r)
    );
    for (name, captured, truncated, unit) in [
        ("stdout", &r.stdout, r.stdout_truncated, "a\n"),
        ("stderr", &r.stderr, r.stderr_truncated, "b\n"),
    ] {
        let expected_prefix = unit.repeat(CAP / 2);
        ensure!(
            captured.len() <= CAP + MARKER_ROOM,
            "{name} kept {} bytes under max_output_bytes = {CAP} (at most {} with a marker)",
            captured.len(),
            CAP + MARKER_ROOM
        );
        ensure!(
            captured.starts_with(&expected_prefix),
            "{name} must keep the first {CAP} bytes the program wrote; it starts with {:?}",
            clip(captured, 60)
        );
        ensure!(
            truncated,
            "{name}_truncated must be true when 1 MB was cut to {CAP} bytes"
        );
    }
    if r.is_success() {
        ensure!(
            sandbox.host_dir().join("done.marker").exists(),
            "the program reported success but did not run to its end"
        );
    }
    Ok(())
}
