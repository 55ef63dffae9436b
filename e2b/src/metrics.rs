//! Sandbox metrics, as E2B's `getMetrics` reads them: every sandbox's use of CPU,
//! memory and disk ([`SandboxHandle::usage`](paddock_pool::SandboxHandle::usage)),
//! sampled every [`SAMPLE_EVERY`] while it runs (not while paused) into a ring of
//! the last hour, and served by `GET /sandboxes/{id}/metrics` (a time range) and
//! `GET /sandboxes/metrics` (the latest of each of up to 100 sandboxes).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime};

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use paddock_core::{ErrorCode, SandboxUsage};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::control::ApiError;
use crate::registry::{Inner, Sbx};

/// How often a sandbox is sampled (E2B's collection interval).
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// When the first sample is taken after the sandbox opens: the CPU use of that
/// first second is its first figure.
const FIRST_AFTER: Duration = Duration::from_secs(1);
/// Samples kept per sandbox: an hour of them.
const KEPT: usize = 720;
/// Most sandboxes one `GET /sandboxes/metrics` names (E2B's bound).
const MAX_IDS: usize = 100;

/// One sample.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: SystemTime,
    cpus: f64,
    cpu_used_pct: f64,
    usage: SandboxUsage,
}

impl Sample {
    /// E2B's `SandboxMetric`.
    fn json(&self) -> Value {
        let secs = self
            .at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        json!({
            // Whole seconds, as E2B's (some date parsers take no more than
            // microseconds).
            "timestamp": crate::control::rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(secs)),
            "timestampUnix": secs,
            "cpuCount": self.cpus.ceil().max(1.0) as u32,
            "cpuUsedPct": (self.cpu_used_pct * 100.0).round() / 100.0,
            "memUsed": self.usage.memory_bytes,
            "memTotal": self.usage.memory_limit_bytes,
            "memCache": self.usage.memory_cache_bytes,
            "diskUsed": self.usage.disk_used_bytes,
            "diskTotal": self.usage.disk_total_bytes,
        })
    }
}

/// A sandbox's samples, and the CPU reading the next one is measured from.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    samples: VecDeque<Sample>,
    last: Option<(Instant, u64)>,
}

impl Metrics {
    /// Takes a reading: the first only sets where CPU use is measured from; each
    /// later one is a sample.
    fn record(&mut self, at: SystemTime, now: Instant, usage: SandboxUsage) {
        let Some((then, cpu_then)) = self.last.replace((now, usage.cpu_ns)) else {
            return;
        };
        let wall = now.duration_since(then).as_nanos() as f64;
        // A smaller counter started over (the engine replaced the group).
        let cpu = if usage.cpu_ns >= cpu_then {
            usage.cpu_ns - cpu_then
        } else {
            usage.cpu_ns
        };
        let pct = if wall > 0.0 && usage.cpus > 0.0 {
            (cpu as f64 / (wall * usage.cpus) * 100.0).clamp(0.0, 100.0)
        } else {
            0.0
        };
        if self.samples.len() == KEPT {
            self.samples.pop_front();
        }
        self.samples.push_back(Sample {
            at,
            cpus: usage.cpus,
            cpu_used_pct: pct,
            usage,
        });
    }

    /// The samples from `start` to `end` (Unix seconds, both included), oldest first.
    fn between(&self, start: Option<u64>, end: Option<u64>) -> Vec<Value> {
        let secs = |t: SystemTime| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        };
        self.samples
            .iter()
            .filter(|s| {
                start.is_none_or(|b| secs(s.at) >= b) && end.is_none_or(|e| secs(s.at) <= e)
            })
            .map(Sample::json)
            .collect()
    }
}

/// Samples `sbx` until it goes: a reading now, then one after [`FIRST_AFTER`] and
/// every [`SAMPLE_EVERY`]. A paused sandbox is not read; an engine that cannot tell
/// a sandbox's usage stops the sampling (its metrics stay empty).
pub(crate) fn start_sampling(sbx: &Arc<Sbx>) {
    let weak: Weak<Sbx> = Arc::downgrade(sbx);
    let gone = sbx.gone.clone();
    actix_web::rt::spawn(async move {
        let mut wait = Duration::ZERO;
        loop {
            tokio::select! {
                _ = gone.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            wait = if wait.is_zero() {
                FIRST_AFTER
            } else {
                SAMPLE_EVERY
            };
            let Some(sbx) = weak.upgrade() else { return };
            if sbx.paused.load(Ordering::Acquire) {
                // Measured again from the resume on.
                sbx.metrics.lock().last = None;
                continue;
            }
            match sbx.handle.usage().await {
                Ok(usage) => sbx
                    .metrics
                    .lock()
                    .record(SystemTime::now(), Instant::now(), usage),
                Err(e) if e.code == ErrorCode::CapabilityNotSupported => return,
                Err(e) if matches!(e.code, ErrorCode::NotFound | ErrorCode::EngineDisposed) => {
                    return
                }
                Err(e) => {
                    tracing::debug!(sandbox = %sbx.id, error = %e, "sampling its usage failed")
                }
            }
        }
    });
}

#[derive(Debug, Default, Deserialize)]
struct Range {
    start: Option<u64>,
    end: Option<u64>,
}

/// `GET /sandboxes/{id}/metrics?start=&end=`: the sandbox's samples in the range
/// (Unix seconds; unset: from its start, to now).
pub(crate) async fn sandbox_metrics(
    inner: web::Data<Arc<Inner>>,
    req: HttpRequest,
    id: web::Path<String>,
) -> HttpResponse {
    let run = || -> Result<HttpResponse, ApiError> {
        let sbx = crate::control::mine(&inner, &req, &id)?;
        let range = web::Query::<Range>::from_query(req.query_string())
            .map_err(|e| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("query: {e}; `start` and `end` are Unix times in seconds"),
                )
            })?
            .into_inner();
        if let (Some(s), Some(e)) = (range.start, range.end) {
            if s > e {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("`start` ({s}) is after `end` ({e})"),
                ));
            }
        }
        let found = sbx.metrics.lock().between(range.start, range.end);
        Ok(HttpResponse::Ok().json(found))
    };
    run().unwrap_or_else(|e| e.response())
}

/// `GET /sandboxes/metrics?sandbox_ids=a,b`: the latest sample of each named
/// sandbox the caller may see that has one (another tenant's, or one not known, is
/// left out, as a sandbox that does not exist).
pub(crate) async fn latest_metrics(inner: web::Data<Arc<Inner>>, req: HttpRequest) -> HttpResponse {
    let run = || -> Result<HttpResponse, ApiError> {
        let caller = crate::control::caller(&inner, &req)?;
        let ids: Vec<String> = web::Query::<Vec<(String, String)>>::from_query(req.query_string())
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("query: {e}")))?
            .into_inner()
            .into_iter()
            .filter(|(k, _)| k == "sandbox_ids")
            .flat_map(|(_, v)| v.split(',').map(str::to_string).collect::<Vec<_>>())
            .filter(|id| !id.is_empty())
            .collect();
        if ids.is_empty() {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "give `sandbox_ids`, the sandboxes' ids separated by commas",
            ));
        }
        if ids.len() > MAX_IDS {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("{} sandbox ids; at most {MAX_IDS}", ids.len()),
            ));
        }
        let mut found = serde_json::Map::new();
        for id in ids {
            let Some(sbx) = inner.visible(&caller, &id) else {
                continue;
            };
            let latest = sbx.metrics.lock().samples.back().map(Sample::json);
            if let Some(latest) = latest {
                found.insert(id, latest);
            }
        }
        Ok(HttpResponse::Ok().json(json!({ "sandboxes": found })))
    };
    run().unwrap_or_else(|e| e.response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(cpu_ns: u64) -> SandboxUsage {
        SandboxUsage {
            cpu_ns,
            cpus: 2.0,
            memory_bytes: 10 << 20,
            memory_cache_bytes: 1 << 20,
            memory_limit_bytes: 512 << 20,
            disk_used_bytes: 4096,
            disk_total_bytes: 1 << 30,
        }
    }

    #[test]
    fn samples_measure_cpu_between_readings_and_keep_an_hour() {
        let mut m = Metrics::default();
        let (t0, i0) = (
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_000),
            Instant::now(),
        );
        m.record(t0, i0, usage(0));
        assert!(
            m.between(None, None).is_empty(),
            "the first reading is a baseline"
        );
        // One of two CPUs busy for the whole second: 50 %.
        m.record(
            t0 + Duration::from_secs(1),
            i0 + Duration::from_secs(1),
            usage(1_000_000_000),
        );
        let got = m.between(None, None);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0]["cpuUsedPct"], 50.0);
        assert_eq!(got[0]["cpuCount"], 2);
        assert_eq!(got[0]["timestampUnix"], 1_001);
        assert_eq!(got[0]["memUsed"], 10 << 20);
        assert_eq!(got[0]["memTotal"], 512 << 20);
        assert_eq!(got[0]["diskTotal"], 1u64 << 30);
        assert_eq!(got[0]["timestamp"], "1970-01-01T00:16:41Z");
        // A counter that started over is measured from zero; never above 100 %.
        m.record(
            t0 + Duration::from_secs(2),
            i0 + Duration::from_secs(2),
            usage(10_000_000_000),
        );
        m.record(
            t0 + Duration::from_secs(3),
            i0 + Duration::from_secs(3),
            usage(100_000_000),
        );
        let pcts: Vec<f64> = m
            .between(None, None)
            .iter()
            .map(|v| v["cpuUsedPct"].as_f64().unwrap())
            .collect();
        assert_eq!(pcts, vec![50.0, 100.0, 5.0]);
        // Ranges are in seconds, both ends included.
        assert_eq!(m.between(Some(1_002), Some(1_002)).len(), 1);
        assert_eq!(m.between(Some(1_002), None).len(), 2);
        assert!(m.between(None, Some(1_000)).is_empty());
        // Bounded: the oldest go.
        for k in 0..KEPT as u64 + 10 {
            m.record(
                t0 + Duration::from_secs(10 + k),
                i0 + Duration::from_secs(10 + k),
                usage(0),
            );
        }
        let all = m.between(None, None);
        assert_eq!(all.len(), KEPT);
        assert_eq!(all[0]["timestampUnix"], 1_000 + 10 + 10);
    }
}
