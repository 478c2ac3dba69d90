//! What a decode token costs the host, counted by the engine: the host's time
//! split into phases (prepare / encode / submit / wait / post on a GPU, prepare /
//! compute / post on the CPU) and, on a GPU, what the device's context did for
//! the token ([`GpuCounts`]: dispatches, passes, submits, queue writes, objects
//! created, host waits, bytes read back) and the GPU's own time for it (each
//! chained step's timestamps, `gpu::TokenStamps`). The engine tallies every decode
//! step but the first (the warm-up: it compiles the decode schedule) and the
//! profiled ones (their query sets, and a pass-per-step profile's passes, are not
//! the token's own); reports give the averages per tallied token ([`DecodeCounters`]).

use std::time::Instant;

use serde::Serialize;

use crate::gpu::GpuCounts;

/// Host seconds of one pass, by phase.
#[derive(Clone, Copy, Debug, Default)]
pub struct Phases {
    /// Embedding lookup, the schedule moved to the position, programs rebuilt or
    /// kept, the input written.
    pub prepare: f64,
    /// GPU: command buffers recorded and finished.
    pub encode: f64,
    /// GPU: `queue.submit`.
    pub submit: f64,
    /// GPU: blocking until the GPU has finished (validation scope included).
    pub wait: f64,
    /// CPU: the kernels, run on the host's pool.
    pub compute: f64,
    /// The logits read back (GPU: staging buffers mapped and copied out) and the
    /// host work after it (blocks gathered into one row, soft-capping).
    pub post: f64,
}

impl Phases {
    fn plus(&self, o: &Phases) -> Phases {
        Phases {
            prepare: self.prepare + o.prepare,
            encode: self.encode + o.encode,
            submit: self.submit + o.submit,
            wait: self.wait + o.wait,
            compute: self.compute + o.compute,
            post: self.post + o.post,
        }
    }
}

/// A stopwatch read in laps: each [`Lap::lap`] is the seconds since the previous one.
pub struct Lap(Instant);

impl Lap {
    pub fn start() -> Lap {
        Lap(Instant::now())
    }

    /// Seconds since the start or the last lap; starts the next one.
    pub fn lap(&mut self) -> f64 {
        let now = Instant::now();
        let s = now.duration_since(self.0).as_secs_f64();
        self.0 = now;
        s
    }
}

/// Running totals over the tallied decode tokens of one engine.
#[derive(Clone, Debug, Default)]
pub struct DecodeTally {
    tokens: u64,
    host: Phases,
    /// None on the CPU.
    gpu: Option<GpuCounts>,
    /// Tallied tokens whose GPU time was measured, and that time in seconds.
    timed_tokens: u64,
    gpu_seconds: f64,
}

impl DecodeTally {
    /// `tokens` more tallied tokens (one step, or a chain's kept steps): their
    /// host phases and, on a GPU, their counts.
    pub fn add(&mut self, tokens: u64, host: &Phases, gpu: Option<GpuCounts>) {
        self.tokens += tokens;
        self.host = self.host.plus(host);
        self.gpu = match (self.gpu, gpu) {
            (Some(a), Some(b)) => Some(a.plus(&b)),
            (a, b) => a.or(b),
        };
    }

    /// The GPU time of a tallied chain that ran `steps` steps, `kept` of them
    /// tallied (the steps past a stop are discarded): `kept / steps` of `seconds`.
    pub fn add_gpu_time(&mut self, kept: u64, steps: u64, seconds: f64) {
        if steps > 0 && kept > 0 {
            self.timed_tokens += kept;
            self.gpu_seconds += seconds * kept as f64 / steps as f64;
        }
    }

    /// The averages per tallied token; None before any token was tallied.
    pub fn per_token(&self) -> Option<DecodeCounters> {
        if self.tokens == 0 {
            return None;
        }
        let n = self.tokens as f64;
        let us = |s: f64| s * 1e6 / n;
        let h = &self.host;
        let gpu = self.gpu.is_some();
        let on_gpu = |s: f64| gpu.then(|| us(s));
        Some(DecodeCounters {
            tokens: self.tokens,
            host_us: HostUs {
                prepare: us(h.prepare),
                encode: on_gpu(h.encode),
                submit: on_gpu(h.submit),
                wait: on_gpu(h.wait),
                compute: (!gpu).then(|| us(h.compute)),
                post: us(h.post),
                total: us(h.prepare + h.encode + h.submit + h.wait + h.compute + h.post),
            },
            gpu_ms: (self.timed_tokens > 0).then(|| self.gpu_seconds * 1e3 / self.timed_tokens as f64),
            gpu: self.gpu.map(|c| {
                let per = |v: u64| v as f64 / n;
                GpuPerToken {
                    dispatches: per(c.dispatches),
                    compute_passes: per(c.passes),
                    submits: per(c.submits),
                    write_buffer_calls: per(c.writes),
                    write_buffer_bytes: per(c.write_bytes),
                    objects_created: per(c.buffers + c.bind_groups + c.query_sets + c.pipelines),
                    buffers_created: per(c.buffers),
                    bind_groups_created: per(c.bind_groups),
                    query_sets_created: per(c.query_sets),
                    pipelines_created: per(c.pipelines),
                    host_waits: per(c.waits),
                    read_back_bytes: per(c.read_bytes),
                    embedding_on_gpu: false,
                }
            }),
        })
    }
}

/// Per decode token, averaged over the engine's decode steps after the first (the
/// warm-up, which compiles the decode schedule), profiled steps left out.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DecodeCounters {
    /// The decode tokens the averages are over.
    pub tokens: u64,
    /// Host time per token by phase, µs.
    pub host_us: HostUs,
    /// The GPU's time per token, ms: each chained step's span from its first
    /// pass's start to its token's pick's end (timestamps), over the tallied
    /// tokens of chains; null on the CPU and on adapters without timestamp queries.
    pub gpu_ms: Option<f64>,
    /// What the GPU's context did per token (null on the CPU: no dispatches,
    /// queue writes or readback there).
    pub gpu: Option<GpuPerToken>,
}

/// Host µs per token by phase ([`Phases`]); a phase the engine's backend does not
/// have is null.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HostUs {
    pub prepare: f64,
    pub encode: Option<f64>,
    pub submit: Option<f64>,
    pub wait: Option<f64>,
    pub compute: Option<f64>,
    pub post: f64,
    /// The phases' sum.
    pub total: f64,
}

/// A GPU engine's [`GpuCounts`] per token.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuPerToken {
    pub dispatches: f64,
    pub compute_passes: f64,
    pub submits: f64,
    pub write_buffer_calls: f64,
    pub write_buffer_bytes: f64,
    /// Buffers, bind groups, query sets and pipelines created, together and each.
    pub objects_created: f64,
    pub buffers_created: f64,
    pub bind_groups_created: f64,
    pub query_sets_created: f64,
    pub pipelines_created: f64,
    /// Blocking polls of the device (a buffer map's included).
    pub host_waits: f64,
    pub read_back_bytes: f64,
    /// Whether the token's embedding row was looked up on the GPU (false: the
    /// host wrote it, the table not being on the GPU: untied from the LM head,
    /// or stored there in another type). The tally
    /// does not know it; [`super::Engine::decode_counters`] sets it.
    pub embedding_on_gpu: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn averages_are_per_tallied_token_and_the_cpu_has_no_gpu_phases() {
        let mut t = DecodeTally::default();
        assert!(t.per_token().is_none(), "nothing tallied");
        let p = Phases { prepare: 1e-6, compute: 3e-6, post: 2e-6, ..Phases::default() };
        t.add(1, &p, None);
        t.add(1, &p, None);
        let c = t.per_token().expect("tallied");
        assert_eq!(c.tokens, 2);
        assert!((c.host_us.prepare - 1.0).abs() < 1e-9 && (c.host_us.total - 6.0).abs() < 1e-9, "{c:?}");
        assert_eq!((c.host_us.encode, c.host_us.wait, c.gpu_ms), (None, None, None));
        assert!(c.host_us.compute.is_some() && c.gpu.is_none());

        let mut g = DecodeTally::default();
        let counts =
            |reads: u64| GpuCounts { dispatches: 10, read_bytes: reads, writes: 3, buffers: 1, bind_groups: 1, ..GpuCounts::default() };
        g.add(1, &Phases { wait: 4e-6, ..Phases::default() }, Some(counts(1024)));
        g.add(1, &Phases::default(), Some(counts(0)));
        let c = g.per_token().expect("tallied");
        let gpu = c.gpu.expect("GPU counts");
        assert_eq!((gpu.dispatches, gpu.read_back_bytes, gpu.write_buffer_calls, gpu.objects_created), (10.0, 512.0, 3.0, 2.0));
        assert_eq!((c.host_us.wait, c.host_us.compute), (Some(2.0), None));
        assert_eq!(c.gpu_ms, None, "no GPU time measured");
        // A chain of 4 steps, 3 kept: 3/4 of its 8 ms over 3 tokens.
        g.add_gpu_time(3, 4, 8e-3);
        g.add_gpu_time(0, 1, 1.0);
        let ms = g.per_token().and_then(|c| c.gpu_ms).expect("GPU time");
        assert!((ms - 2.0).abs() < 1e-9, "{ms}");
    }
}
