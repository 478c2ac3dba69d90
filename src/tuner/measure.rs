//! Timing one slot's candidates at the model's real shapes: inputs built once per
//! shape, GPU programs compiled once per candidate, repetitions calibrated so each
//! sample spans enough time to read, GPU timestamp queries where the adapter has
//! them (wall clock otherwise), and the race that interleaves candidates round by
//! round and drops clear losers. Measurement code never prints.

use std::sync::Arc;
use std::time::Instant;

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use crate::gpu::{GpuCtx, GpuProgram};
use crate::kernels::cpu::qgemm::{PanelCache, with_panels};
use crate::kernels::verify::{GpuBuffers, HostTensor, InputMemo, make_inputs, make_inputs_shared, output_lens};
use crate::kernels::{CpuArgs, DType, KernelDef, Params, Problem};
use crate::stats::{Stats, summarize};

/// How the tuner searches one slot's candidates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Successive halving with racing (drop candidates whose interval lies above the
    /// best's), then only the most promising combinations end to end.
    Auto,
    /// Every candidate to full samples; every combination end to end.
    Exhaustive,
    /// Successive halving; every combination end to end.
    Halving,
    /// A seeded random subset of candidates to full samples.
    Random,
}

impl Strategy {
    pub fn parse(s: &str) -> Option<Strategy> {
        Some(match s {
            "auto" => Strategy::Auto,
            "exhaustive" => Strategy::Exhaustive,
            "halving" => Strategy::Halving,
            "random" => Strategy::Random,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Auto => "auto",
            Strategy::Exhaustive => "exhaustive",
            Strategy::Halving => "halving",
            Strategy::Random => "random",
        }
    }
}

/// Samples a candidate gets in full.
pub const FULL_SAMPLES: usize = 9;
/// Shortest stretch of work one sample times (repetitions are calibrated to it).
const MIN_SAMPLE_S: f64 = 0.002;

/// One variant competing for a slot.
#[derive(Clone, Debug)]
pub struct Cand {
    pub kernel: &'static KernelDef,
    pub params: Params,
}

/// The shapes of one slot with their dispatch counts per pass, inputs built once.
///
/// Each shape's inputs come in enough copies to overflow the last-level cache
/// (`rotate_bytes`), and consecutive executions cycle through them, as PyTorch
/// TunableOp's rotating buffers do: in a model pass every layer reads its own
/// weights and KV cache from memory, so a kernel timed over one hot copy would be
/// ranked at cache speed (a 576×576 GEMV fits in L2) rather than at the speed the
/// pass sees. On the CPU the copies are host tensors (the last-level cache); on a
/// GPU they are separate buffers, each with the inputs of its own seed
/// ([`copy_seed`]), against the adapter's L2 (50–128 MB on current GPUs).
pub struct Workload {
    pub dtype: DType,
    pub shapes: Vec<(Problem, usize)>,
    /// CPU: per shape, its input copies (one at least; the first may be shared
    /// with an [`InputMemo`] and other workloads).
    inputs: Vec<Vec<Vec<Arc<HostTensor>>>>,
    /// Per shape, how many input copies executions rotate through.
    copies: Vec<usize>,
    /// GPU: per shape, one set of buffers per copy.
    gpu: Option<(Arc<GpuCtx>, Vec<Vec<GpuBuffers>>)>,
    /// CPU: the candidates' packed GEMM rows kept across executions (one
    /// `qgemm::PanelCache` for the race's candidates, as an engine of decode
    /// batches keeps one for its kernels); each candidate's warm-up runs every
    /// input copy once, so no timed execution packs ([`Workload::keep_panels`]).
    pub panels: Option<Arc<PanelCache>>,
}

/// Copies of `bytes` of inputs that together reach `rotate_bytes` (at most 256).
pub fn rotating_copies(bytes: usize, rotate_bytes: usize) -> usize {
    if bytes == 0 { 1 } else { rotate_bytes.div_ceil(bytes).clamp(1, 256) }
}

/// The seed of input copy `copy` of a GPU workload built with `seed`.
pub fn copy_seed(seed: u64, copy: usize) -> u64 {
    seed.wrapping_add((copy as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

impl Workload {
    pub fn new(shapes: Vec<(Problem, usize)>, dtype: DType, gpu: Option<Arc<GpuCtx>>, seed: u64, rotate_bytes: usize) -> Workload {
        Workload::with_memo(shapes, dtype, gpu, seed, rotate_bytes, None)
    }

    /// [`Workload::new`], the CPU's large inputs drawn once per `memo` (the slot
    /// races share one: an LM head's weight serves its GEMM, GEMV and norm-fused
    /// races).
    pub fn with_memo(
        shapes: Vec<(Problem, usize)>,
        dtype: DType,
        gpu: Option<Arc<GpuCtx>>,
        seed: u64,
        rotate_bytes: usize,
        memo: Option<&InputMemo>,
    ) -> Workload {
        let mut inputs = Vec::new();
        let mut copies = Vec::new();
        let mut gpu_bufs = Vec::new();
        for (p, _) in &shapes {
            let first: Vec<Arc<HostTensor>> = match memo.filter(|_| gpu.is_none()) {
                Some(m) => make_inputs_shared(p, dtype, seed, m),
                None => make_inputs(p, dtype, seed).into_iter().map(Arc::new).collect(),
            };
            let bytes: usize = first.iter().map(|t| t.bytes().len()).sum();
            let n = rotating_copies(bytes, rotate_bytes);
            copies.push(n);
            match &gpu {
                None => {
                    // The copies after the first are copies in memory (what the
                    // rotation is for), never shared.
                    let mut all: Vec<Vec<Arc<HostTensor>>> = Vec::with_capacity(n);
                    all.extend((1..n).map(|_| first.iter().map(|t| Arc::new(t.huge_clone())).collect()));
                    all.insert(0, first);
                    all.iter().flatten().for_each(|t| t.huge_pages());
                    inputs.push(all);
                }
                Some(ctx) => {
                    let first: Vec<HostTensor> = first.into_iter().map(Arc::unwrap_or_clone).collect();
                    // Distinct contents per copy: a test can tell the copies apart
                    // by their results, and no driver can merge them.
                    let mut bufs = vec![GpuBuffers::new(ctx, p, dtype, &first)];
                    bufs.extend((1..n).map(|c| GpuBuffers::new(ctx, p, dtype, &make_inputs(p, dtype, copy_seed(seed, c)))));
                    gpu_bufs.push(bufs);
                    inputs.push(Vec::new());
                }
            }
        }
        let gpu = gpu.map(|ctx| (ctx, gpu_bufs));
        Workload { dtype, shapes, inputs, copies, gpu, panels: None }
    }

    /// Input copies of shape `i`.
    pub fn copies(&self, i: usize) -> usize {
        self.copies[i]
    }

    /// Holds the inputs as `h` says: packed rows kept, weights repacked.
    pub fn hold(&mut self, h: &Holding) {
        if h.kept_panels {
            self.keep_panels();
        }
        self.repack(&h.repack);
    }

    /// Keeps the CPU candidates' packed GEMM rows across executions
    /// ([`Workload::panels`]; nothing on a GPU).
    pub fn keep_panels(&mut self) {
        if self.gpu.is_none() {
            self.panels = Some(Arc::default());
        }
    }

    /// The CPU inputs' block-format weights in the layout an engine that
    /// repacks `formats` keeps them in ([`QMatrix::repacked_in`]: X8 records),
    /// every input copy's, as a server's matrices are (the batch regimes' races
    /// time their candidates over what the server will run them on: the
    /// batched decode dots read X8 records about 3.5x as fast as plain rows at
    /// 8 tokens); nothing on a GPU or with `formats` empty.
    pub fn repack(&mut self, formats: &[crate::kernels::quant::QFormat]) {
        if self.gpu.is_some() || formats.is_empty() {
            return;
        }
        for t in self.inputs.iter_mut().flatten().flatten() {
            if let HostTensor::Q(m) = &**t
                && let Some(x8) = m.repacked_in(formats)
            {
                let x8 = HostTensor::Q(x8);
                x8.huge_pages();
                *t = Arc::new(x8);
            }
        }
    }

    /// The GPU buffers of copy `copy` of shape `i` (None on the CPU).
    pub fn gpu_buffers(&self, i: usize, copy: usize) -> Option<&GpuBuffers> {
        self.gpu.as_ref().and_then(|(_, b)| b.get(i)).and_then(|c| c.get(copy))
    }
}

/// A candidate prepared to run: output buffers (CPU) or programs (GPU), and the
/// calibrated repetitions per shape.
pub struct Runner {
    pub cand: Cand,
    outs: Vec<Vec<Vec<f32>>>,
    /// GPU: per shape, one program per input copy.
    progs: Vec<Vec<GpuProgram>>,
    reps: Vec<u32>,
    pub samples: Vec<f64>,
    /// Per-shape seconds of each sample.
    pub shape_samples: Vec<Vec<f64>>,
    pub dropped: Option<usize>,
    pub error: Option<String>,
    pub timestamps: bool,
    /// Wall seconds of the warm-up: one execution of every shape, every input
    /// copy's where the packed rows are kept (0 until prepared).
    pub warm_up: f64,
    /// Seconds of one execution of every shape once warm: what a sample's
    /// executions cost (with kept packed rows, timed after the warm-up packed
    /// them, which a server does once: the int8 GEMM's packing had made its
    /// warm-up 11x the f32 kernel's at two sequences, which ran 10x slower).
    pub exec_s: f64,
    /// The input copy the next execution reads (cycles through the copies).
    next_copy: usize,
}

/// How a set of races holds its inputs on a CPU: the slot races' plain way
/// (the default: nothing kept, plain rows), or a server's, which the batch
/// regimes' races time their candidates in.
#[derive(Clone, Debug, Default)]
pub struct Holding {
    /// The CPU kernels' packed rows kept across calls, as an engine of decode
    /// batches keeps them (`qgemm::PanelCache`): the int8 GEMMs would
    /// otherwise time packing the runtime does not do.
    pub kept_panels: bool,
    /// The block formats whose weights are timed in X8 records
    /// ([`Workload::repack`]): the layouts the server loads
    /// (`serve.cpuRepack`); empty: plain rows.
    pub repack: Vec<crate::kernels::quant::QFormat>,
}

impl Holding {
    /// A server's: packed rows kept, `repack`'s formats in X8 records.
    pub fn server(repack: Vec<crate::kernels::quant::QFormat>) -> Holding {
        Holding { kept_panels: true, repack }
    }

    /// What a race's cache key says of it; None for the plain way (the slot
    /// races' keys stay as they were).
    pub fn key(&self) -> Option<String> {
        (self.kept_panels || !self.repack.is_empty()).then(|| {
            let x8: Vec<&str> = self.repack.iter().map(|f| f.name()).collect();
            format!("kept panels {}; x8 {}", self.kept_panels, x8.join(","))
        })
    }
}

/// Executions after a kept-panel warm-up that time a shape's steady cost.
const STEADY_RUNS: u32 = 8;

impl Runner {
    pub fn new(cand: Cand, w: &Workload) -> Runner {
        let mut r = Runner {
            cand,
            outs: Vec::new(),
            progs: Vec::new(),
            reps: Vec::new(),
            samples: Vec::new(),
            shape_samples: vec![Vec::new(); w.shapes.len()],
            dropped: None,
            error: None,
            timestamps: false,
            warm_up: 0.0,
            exec_s: 0.0,
            next_copy: 0,
        };
        if let Err(e) = r.prepare(w) {
            r.error = Some(e);
        }
        r
    }

    fn prepare(&mut self, w: &Workload) -> Result<(), String> {
        let k = self.cand.kernel;
        match &w.gpu {
            None => {
                self.outs = w.shapes.iter().map(|(p, _)| output_lens(p, w.dtype).into_iter().map(|n| vec![0f32; n]).collect()).collect();
            }
            Some((ctx, bufs)) => {
                self.timestamps = ctx.caps.timestamp_query;
                for ((p, _), copies) in w.shapes.iter().zip(bufs) {
                    let progs = copies
                        .iter()
                        .map(|b| k.prepare_wgsl(ctx, p, w.dtype, &self.cand.params, &b.refs(), None).map_err(|e| e.to_string()))
                        .collect::<Result<Vec<_>, _>>()?;
                    self.progs.push(progs);
                }
            }
        }
        // Warm up once per shape, and where that execution packed rows into
        // the kept panels, every other input copy once too (none is packed
        // while timed); then calibrate repetitions. A candidate that keeps no
        // panels (the dots, the f32 GEMMs) warms up once: a rotation of twice
        // a 300 MiB last-level cache is 64 copies of a 1B model's 9 MiB
        // matrix, whose warm-ups had taken three quarters of its batch races'
        // time, every candidate's.
        for i in 0..w.shapes.len() {
            let packed = || w.panels.as_ref().map(|p| p.bytes());
            let before = packed();
            let t = self.time_shape(w, i, 1)?;
            self.warm_up += t;
            // (At most 256 copies: `rotating_copies`.)
            let rest = if packed() != before { w.copies(i) as u32 - 1 } else { 0 };
            let t = if rest > 0 {
                self.warm_up += self.time_shape(w, i, rest)? * f64::from(rest);
                // Packed now: a few more executions give the steady cost.
                self.time_shape(w, i, (rest + 1).min(STEADY_RUNS))?
            } else {
                t
            };
            self.exec_s += t;
            let reps = (MIN_SAMPLE_S / t.max(1e-9)).ceil().clamp(1.0, 2000.0) as u32;
            self.reps.push(reps);
        }
        Ok(())
    }

    /// Seconds per execution of shape `i`, over `reps` back-to-back executions.
    fn time_shape(&mut self, w: &Workload, i: usize, reps: u32) -> Result<f64, String> {
        let k = self.cand.kernel;
        let (p, _) = &w.shapes[i];
        match &w.gpu {
            None => {
                let copies = &w.inputs[i];
                let outs = &mut self.outs[i];
                let params = &self.cand.params;
                let next = &mut self.next_copy;
                // On the calling thread, as the runtime runs its passes: the
                // kernel's parallel loops go to the kernels' pool.
                let mut timed = || {
                    let t0 = Instant::now();
                    for _ in 0..reps {
                        *next = (*next + 1) % copies.len();
                        let args = CpuArgs {
                            ins: copies[*next].iter().map(|t| t.as_in()).collect(),
                            outs: outs.iter_mut().map(|v| v.as_mut_slice()).collect(),
                        };
                        k.run_cpu(p, w.dtype, params, args).map_err(|e| e.to_string())?;
                    }
                    Ok(t0.elapsed().as_secs_f64() / reps as f64)
                };
                match &w.panels {
                    Some(kept) => with_panels(kept, timed),
                    None => timed(),
                }
            }
            Some((ctx, _)) => {
                let progs = &self.progs[i];
                let first = self.next_copy;
                self.next_copy = (first + reps as usize) % progs.len().max(1);
                if let Some(t) = ctx.time_programs(progs, first, reps).map_err(|e| e.to_string())? {
                    return Ok(t);
                }
                let all: Vec<&GpuProgram> = (0..reps as usize).map(|r| &progs[(first + r) % progs.len()]).collect();
                let t0 = Instant::now();
                ctx.run(k.id, &all).map_err(|e| e.to_string())?;
                Ok(t0.elapsed().as_secs_f64() / reps as f64)
            }
        }
    }

    /// One composite sample: every shape once (calibrated), weighted by its count.
    pub fn sample(&mut self, w: &Workload) {
        if self.error.is_some() {
            return;
        }
        let mut total = 0.0;
        for i in 0..w.shapes.len() {
            match self.time_shape(w, i, self.reps[i]) {
                Ok(t) => {
                    self.shape_samples[i].push(t);
                    total += t * w.shapes[i].1 as f64;
                }
                Err(e) => {
                    self.error = Some(e);
                    return;
                }
            }
        }
        self.samples.push(total);
    }

    pub fn stats(&self) -> Stats {
        summarize(&self.samples)
    }

    /// GPU: the program of shape `i` over input copy `copy`.
    pub fn program(&self, i: usize, copy: usize) -> Option<&GpuProgram> {
        self.progs.get(i).and_then(|p| p.get(copy))
    }
}

/// How slot races keep the caches from flattering a kernel: the cache its input
/// copies must overflow, and the bytes of copies they rotate through (twice it).
/// Recorded in the profile (`tuning.measurement`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Rotation {
    /// Bytes of the cache the copies overflow (GPU: L2; CPU: the last-level cache).
    pub cache_bytes: u64,
    /// Where `cache_bytes` comes from (an estimate per vendor and class, a
    /// measurement of the host, or `--gpu-l2-bytes`).
    pub cache_source: String,
    /// Bytes of input copies each shape's executions cycle through.
    pub rotate_bytes: u64,
}

impl Rotation {
    /// The method's name in the profile.
    pub const METHOD: &'static str = "rotate";

    /// Copies of twice `cache_bytes`.
    pub fn over(cache_bytes: u64, cache_source: impl Into<String>) -> Rotation {
        Rotation { cache_bytes, cache_source: cache_source.into(), rotate_bytes: cache_bytes.saturating_mul(2) }
    }

    /// The rotation for `device`: a GPU's L2 (`l2_override`, else the estimate for
    /// its vendor and class), the CPU's last-level cache (64 MiB of copies when the
    /// size is unknown). `l2_override` applies to GPUs only.
    pub fn for_device(device: &crate::device::Device, l2_override: Option<u64>) -> Rotation {
        use crate::device::Device;
        match device {
            Device::Gpu(_) => match (l2_override, device.gpu_l2_estimate()) {
                (Some(b), _) => Rotation::over(b, "--gpu-l2-bytes"),
                (None, Some(e)) => Rotation::over(e.bytes, e.source),
                (None, None) => Rotation::over(128 << 20, "estimate: unknown GPU"),
            },
            Device::Cpu(c) if c.cache_l3 > 0 => Rotation::over(c.cache_l3, "cpu last-level cache (L3)"),
            Device::Cpu(c) if c.cache_l2 > 0 => {
                Rotation { cache_bytes: c.cache_l2, cache_source: "cpu L2 (no L3)".into(), rotate_bytes: 4 * c.cache_l2 }
            }
            Device::Cpu(_) => Rotation { cache_bytes: 0, cache_source: "cpu cache size unknown".into(), rotate_bytes: 64 << 20 },
        }
    }
}

/// Samples per candidate in each round of a race (halving and racing between rounds).
pub fn rounds(strategy: Strategy) -> &'static [usize] {
    match strategy {
        Strategy::Exhaustive | Strategy::Random => &[3, 3, 3],
        Strategy::Halving | Strategy::Auto => &[1, 2, 3, 3],
    }
}

/// When a race stops sampling. Past `soft`, only candidates without a sample get
/// one (each candidate gets a number while that is cheap); past `hard`, none does,
/// except the first sample of a race that has none (a race needs a winner). A
/// slot race's `hard` is its share of the budget plus a grace ([`Deadline::share`]),
/// so races whose samples take seconds (the vision tower's ops at their real
/// shapes) stop near their share instead of timing every candidate once.
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    pub soft: Instant,
    pub hard: Option<Instant>,
}

impl Deadline {
    /// No hard stop: past `at`, every candidate still gets its one sample.
    pub fn soft(at: Instant) -> Deadline {
        Deadline { soft: at, hard: None }
    }

    /// A race's share of the budget from now: soft at `share`, hard a quarter of
    /// it later.
    pub fn share(share: std::time::Duration) -> Deadline {
        let soft = Instant::now() + share;
        Deadline { soft, hard: Some(soft + share / 4) }
    }

    /// Past the soft deadline.
    pub fn passed(&self) -> bool {
        Instant::now() > self.soft
    }

    /// Past the hard deadline: nothing more is prepared or sampled (but a race's
    /// first candidate).
    pub fn exhausted(&self) -> bool {
        self.hard.is_some_and(|h| Instant::now() > h)
    }
}

/// Runs the race among `runners` until the strategy is satisfied or `deadline`.
/// Candidates are sampled in a seeded shuffled order each round so drift hits all
/// alike; losers are dropped between rounds (halving and racing).
/// A runner dropped in round `r` is marked `dropped@(first_round + r + 1)`; earlier
/// drops stand (a descent step races its new candidates against the survivors).
pub fn race(
    runners: &mut [Runner],
    w: &Workload,
    strategy: Strategy,
    deadline: Deadline,
    seed: u64,
    first_round: usize,
    mut tick: impl FnMut(usize),
) {
    if let Some((ctx, _)) = &w.gpu {
        // A race's samples are short bursts: bring the clocks up first. A
        // failure here shows again in the samples, where it is reported.
        let _ = super::warm::settle(ctx);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let rounds = rounds(strategy);
    for (round, &per) in rounds.iter().enumerate() {
        let mut alive: Vec<usize> = (0..runners.len()).filter(|&i| runners[i].dropped.is_none() && runners[i].error.is_none()).collect();
        for pass in 0..per {
            alive.shuffle(&mut rng);
            if first_round == 0 && round == 0 && pass == 0 {
                // Runner 0 (the runtime's default, `space::candidates`) is sampled
                // first: a race its budget stops after one sample has timed the
                // default, not a candidate the shuffle happened to put first.
                if let Some(p) = alive.iter().position(|&i| i == 0) {
                    alive[..=p].rotate_right(1);
                }
            }
            for &i in &alive {
                // Past the deadline, only candidates without any sample still get one;
                // past the hard deadline, only a race's first.
                if deadline.passed() && !runners[i].samples.is_empty() {
                    continue;
                }
                if deadline.exhausted() && runners.iter().any(|r| !r.samples.is_empty()) {
                    continue;
                }
                runners[i].sample(w);
                tick(i);
            }
        }
        if deadline.passed() {
            break;
        }
        let alive: Vec<usize> = (0..runners.len()).filter(|&i| runners[i].dropped.is_none() && runners[i].error.is_none()).collect();
        if alive.len() <= 1 {
            break;
        }
        let stats: Vec<(usize, Stats)> = alive.iter().map(|&i| (i, runners[i].stats())).collect();
        let Some(best) = stats.iter().min_by(|a, b| a.1.median.total_cmp(&b.1.median)).map(|x| x.1.clone()) else { break };
        match strategy {
            Strategy::Exhaustive | Strategy::Random => {}
            Strategy::Halving | Strategy::Auto => {
                let last = round + 1 == rounds.len();
                if !last {
                    let mut order = stats.clone();
                    order.sort_by(|a, b| a.1.median.total_cmp(&b.1.median));
                    let keep = order.len().div_ceil(2).max(2);
                    for (i, _) in order.iter().skip(keep) {
                        runners[*i].dropped = Some(first_round + round + 1);
                    }
                }
                if strategy == Strategy::Auto {
                    for (i, s) in &stats {
                        if runners[*i].dropped.is_none() && s.loses_to(&best) {
                            runners[*i].dropped = Some(first_round + round + 1);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::problem::test_problems;
    use crate::kernels::{Op, Problem};

    #[test]
    fn copies_overflow_the_cache_and_large_inputs_are_not_copied() {
        assert_eq!(rotating_copies(1 << 20, 64 << 20), 64);
        assert_eq!(rotating_copies(100 << 20, 64 << 20), 1);
        assert_eq!(rotating_copies(0, 64 << 20), 1);
        assert_eq!(rotating_copies(1, 64 << 20), 256);
        let p: Problem = test_problems(Op::Gemv).into_iter().next().expect("a gemv test shape");
        let w = Workload::new(vec![(p, 1)], DType::F32, None, 0, 1 << 20);
        assert!(w.copies(0) > 1, "a small shape gets copies: {}", w.copies(0));
    }

    /// The rotation is twice the cache, from the override when one is given, and
    /// the recorded method names it.
    #[test]
    fn rotation_is_twice_the_cache_and_the_cpu_keeps_its_own() {
        let r = Rotation::over(50 << 20, "--gpu-l2-bytes");
        assert_eq!((r.cache_bytes, r.rotate_bytes, r.cache_source.as_str()), (50 << 20, 100 << 20, "--gpu-l2-bytes"));
        assert_eq!(Rotation::METHOD, "rotate");
        let cpu = crate::device::CpuCaps::detect();
        let l3 = cpu.cache_l3;
        let r = Rotation::for_device(&crate::device::Device::Cpu(cpu), Some(1 << 20));
        if l3 > 0 {
            assert_eq!((r.cache_bytes, r.rotate_bytes), (l3, 2 * l3), "the CPU ignores a GPU L2 override");
        }
        assert!(r.rotate_bytes >= 1 << 20);
    }

    /// A batch regime's workload (`keep_panels`) keeps the candidates' packed
    /// rows in one cache, which the first candidate's warm-up fills for every
    /// input copy and the timed executions only read (the int8 GEMM at a
    /// decode batch's 8 rows); another workload keeps none; a candidate that
    /// packs nothing warms up on one copy.
    #[test]
    fn a_batch_regimes_candidates_keep_their_packed_rows() {
        let p = Problem::Gemm { m: 8, n: 256, k: 512 };
        let k = crate::kernels::find("gemm_q_i8_cpu").expect("registered");
        let cand = |rows: u32| {
            let mut params = k.default_params();
            params.insert("rows_per_task".into(), rows);
            Cand { kernel: k, params }
        };
        let mut w = Workload::new(vec![(p.clone(), 1)], DType::Q4_0, None, 5, 1 << 20);
        assert!(w.copies(0) > 1, "copies to rotate through: {}", w.copies(0));
        assert!(w.panels.is_none());
        w.keep_panels();
        let kept = w.panels.clone().expect("a panel cache");
        let mut r = Runner::new(cand(32), &w);
        assert!(r.error.is_none(), "{:?}", r.error);
        let packed = kept.bytes();
        assert!(packed > 0, "the warm-up packed the weight's rows");
        r.sample(&w);
        let mut other = Runner::new(cand(64), &w);
        other.sample(&w);
        assert!(r.error.is_none() && other.error.is_none(), "{:?} {:?}", r.error, other.error);
        assert_eq!(kept.bytes(), packed, "every copy was packed in the first warm-up; nothing after it packs");
        // Executions so far: the packing candidate's warm-up went through
        // every copy (then its steady runs and one sample); the dots, which
        // keep no panels, warm up on one copy.
        let n = w.copies(0);
        assert_eq!(r.next_copy, (n + n.min(STEADY_RUNS as usize) + r.reps[0] as usize) % n);
        let dots = crate::kernels::find("gemm_q_dots_cpu").expect("registered");
        let d = Runner::new(Cand { kernel: dots, params: dots.default_params() }, &w);
        assert!(d.error.is_none(), "{:?}", d.error);
        assert_eq!((d.next_copy, kept.bytes()), (1, packed), "one warm-up execution, nothing packed");
    }

    /// A batch regime's workload over the server's layouts (`repack`) holds
    /// every input copy's weight of a repacked format in X8 records, as the
    /// server's engine loads it, and the batched decode dots run over them with
    /// the values they give over plain rows (within the row dots' 1e-4); a
    /// format not repacked stays in rows.
    #[test]
    fn a_batch_regimes_weights_are_the_servers_x8_records() {
        use crate::kernels::quant::{Layout, QFormat};
        let p = Problem::Gemm { m: 8, n: 256, k: 512 };
        let layouts = |w: &Workload| -> Vec<bool> {
            w.inputs[0]
                .iter()
                .flatten()
                .filter_map(|t| match &**t {
                    HostTensor::Q(m) => Some(matches!(m.layout, Layout::X8 { .. })),
                    _ => None,
                })
                .collect()
        };
        let rows = Workload::new(vec![(p.clone(), 1)], DType::Q4_0, None, 5, 1 << 20);
        let mut x8 = Workload::new(vec![(p.clone(), 1)], DType::Q4_0, None, 5, 1 << 20);
        assert!(x8.copies(0) > 1, "copies to rotate through: {}", x8.copies(0));
        x8.repack(&[QFormat::Q8_0]);
        assert!(layouts(&x8).iter().all(|&x| !x), "Q4_0 is not among the formats: rows");
        x8.repack(&[QFormat::Q4_0, QFormat::Q8_0]);
        let held = layouts(&x8);
        assert_eq!(held.len(), x8.copies(0), "one weight a copy");
        assert!(held.iter().all(|&x| x), "every copy's weight in X8 records: {held:?}");
        let k = crate::kernels::find("gemm_q_dots_cpu").expect("registered");
        let run = |w: &Workload| {
            let r = Runner::new(Cand { kernel: k, params: k.default_params() }, w);
            assert!(r.error.is_none(), "{:?}", r.error);
            r.outs[0][0].clone()
        };
        let (want, got) = (run(&rows), run(&x8));
        assert_eq!(want.len(), got.len());
        for (i, (a, b)) in want.iter().zip(&got).enumerate() {
            assert!((a - b).abs() <= 1e-4 * (1.0 + a.abs()), "output {i}: {b} over X8 against {a} over rows");
        }
    }

    /// A race whose hard stop has passed before it starts samples one candidate
    /// only, and that is runner 0 (the runtime's default) whatever the seed's
    /// shuffle: a starved slot keeps what the runtime would run anyway.
    #[test]
    fn a_race_stopped_after_one_sample_has_timed_the_default() {
        use crate::kernels::Backend;
        let p = Problem::Gemv { n: 16, k: 64 };
        let w = Workload::new(vec![(p.clone(), 1)], DType::F32, None, 3, 0);
        let ks: Vec<_> =
            crate::kernels::for_op(Op::Gemv).filter(|k| k.backend() == Backend::Cpu && k.dtypes.contains(&DType::F32)).collect();
        for seed in 0..8 {
            let mut runners: Vec<Runner> = ks
                .iter()
                .flat_map(|k| [1u32, 2].map(|t| (k, t)))
                .map(|(k, t)| {
                    let mut params = k.default_params();
                    if params.contains_key("threads") {
                        params.insert("threads".into(), t);
                    }
                    Runner::new(Cand { kernel: k, params }, &w)
                })
                .collect();
            assert!(runners.len() >= 4, "{}", runners.len());
            let now = Instant::now();
            race(&mut runners, &w, Strategy::Auto, Deadline { soft: now, hard: Some(now) }, seed, 0, |_| {});
            let sampled: Vec<usize> = (0..runners.len()).filter(|&i| !runners[i].samples.is_empty()).collect();
            assert_eq!(sampled, vec![0], "seed {seed}");
        }
    }

    /// On a GPU the copies are distinct buffers with distinct contents, and each
    /// copy's program computes on its own buffers: every copy's outputs match the
    /// reference over that copy's inputs, and differ from the other copies'.
    #[test]
    fn gpu_copies_are_distinct_buffers_each_computing_its_own_inputs() {
        use crate::kernels::verify::{compare, tolerance};
        use crate::kernels::{Backend, Caps, reference};
        let Some(gpu) = crate::testing::test_gpu() else { return };
        let p = Problem::Gemv { n: 64, k: 128 };
        let seed = 7;
        let one: usize = make_inputs(&p, DType::F32, seed).iter().map(|t| t.bytes().len()).sum();
        let w = Workload::new(vec![(p.clone(), 1)], DType::F32, Some(gpu.clone()), seed, one * 3);
        assert_eq!(w.copies(0), 3);
        let k = crate::kernels::registry()
            .iter()
            .find(|k| {
                k.backend() == Backend::Wgsl
                    && k.op == Op::Gemv
                    && k.check(Caps::Gpu(&gpu.caps), &p, DType::F32, &k.default_params()).is_ok()
            })
            .expect("a WGSL f32 GEMV valid on the test GPU");
        let mut r = Runner::new(Cand { kernel: k, params: k.default_params() }, &w);
        assert!(r.error.is_none(), "{:?}", r.error);
        r.sample(&w);
        assert!(r.samples.first().is_some_and(|t| *t > 0.0), "{:?}", r.samples);
        let mut seen: Vec<Vec<Vec<f32>>> = Vec::new();
        for c in 0..3 {
            let prog = r.program(0, c).expect("a program per copy");
            gpu.run("copy check", &[prog]).expect("runs");
            let outs = w.gpu_buffers(0, c).expect("buffers per copy").read_outputs(&gpu).expect("reads");
            let ins = make_inputs(&p, DType::F32, copy_seed(seed, c));
            let want = reference::compute(&p, &ins.iter().map(HostTensor::to_f64).collect::<Vec<_>>());
            let (err, scale) = compare(&outs, &want);
            assert!(err / scale <= tolerance(DType::F32), "copy {c}: relative error {:.2e}", err / scale);
            assert!(!seen.contains(&outs), "copy {c} computed what an earlier copy did");
            seen.push(outs);
        }
        assert!(r.program(0, 3).is_none());
    }
}

/// Measurements, not checks (ignored; run them on the device at hand). The
/// norm-fused GEMV over a stacked weight of per-operand formats (Gemma 3 270M's
/// mixed layers: Q5_0 queries and keys, Q8_0 values, k 640) against the same
/// kernel over one format at the same size and the three parts on their own, timed
/// by the tuner's own interleaved runner:
/// `CI=true cargo test --release --lib stacked_norm_gemv_timing -- --ignored --nocapture`.
#[cfg(test)]
mod timings {
    use super::*;
    use crate::kernels::quant::QFormat;
    use crate::kernels::{NormResidual, Problem, RowFormats, find};

    #[test]
    #[ignore]
    fn stacked_norm_gemv_timing() {
        let Some(gpu) = crate::testing::test_gpu() else { return };
        let k = find("norm_gemv_q_subgroup").expect("registered");
        let p = |n, formats, residual| Problem::NormGemv { n, k: 640, eps: 1e-6, unit_offset: true, residual, act: None, formats };
        let stack = RowFormats::new(&[(1024, QFormat::Q5_0), (256, QFormat::Q5_0), (256, QFormat::Q8_0)]);
        let cases = [
            ("stack, normed residual", p(1536, stack, NormResidual::Normed), DType::Q5_0),
            ("q5_0 1536, normed residual", p(1536, None, NormResidual::Normed), DType::Q5_0),
            ("stack", p(1536, stack, NormResidual::None), DType::Q5_0),
            ("q5_0 1536", p(1536, None, NormResidual::None), DType::Q5_0),
            ("q8_0 1536", p(1536, None, NormResidual::None), DType::Q8_0),
            ("q5_0 1024", p(1024, None, NormResidual::None), DType::Q5_0),
            ("q5_0 256", p(256, None, NormResidual::None), DType::Q5_0),
            ("q8_0 256", p(256, None, NormResidual::None), DType::Q8_0),
        ];
        time_interleaved(&gpu, cases.into_iter().map(|(name, p, d)| (name, p, d, k)).collect(), 30);
    }

    /// Each case `(name, problem, dtype, kernel)` at its default parameters, sampled
    /// `rounds` times interleaved with the others by the tuner's runner; the medians
    /// with their intervals on stderr.
    fn time_interleaved(gpu: &Arc<GpuCtx>, cases: Vec<(&str, Problem, DType, &'static KernelDef)>, rounds: usize) {
        let mut runners: Vec<(&str, Workload, Runner)> = cases
            .into_iter()
            .map(|(name, p, d, k)| {
                let w = Workload::new(vec![(p, 1)], d, Some(gpu.clone()), 1, 64 << 20);
                let r = Runner::new(Cand { kernel: k, params: k.default_params() }, &w);
                (name, w, r)
            })
            .collect();
        for _ in 0..rounds {
            runners.iter_mut().for_each(|(_, w, r)| r.sample(w));
        }
        for (name, _, r) in &runners {
            let s = r.stats();
            eprintln!("{name}: median {:.1} µs (95% CI {:.1}–{:.1})", s.median * 1e6, s.ci[0] * 1e6, s.ci[1] * 1e6);
        }
    }

    /// The gathered and the grouped WGSL expert kernels in prefill: 64 tokens, each
    /// of 32 experts taking 8 of them on average (4 a token), expert_ff 256, hidden
    /// 512, Q4_K (Qwen3-30B-A3B's 128 x 8 over 768 x 2048 takes lavapipe minutes a
    /// call): `CI=true cargo test --release --lib moe_prefill_timing -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn moe_prefill_timing() {
        let Some(gpu) = crate::testing::test_gpu() else { return };
        let (rows, experts, top_k, ff, hidden) = (64, 32, 4, 256, 512);
        let gate_up = Problem::MoeGateUp { rows, experts, top_k, n: ff, k: hidden, act: crate::kernels::Activation::Silu };
        let down = Problem::MoeDown { rows, experts, top_k, n: hidden, k: ff };
        let cases = [
            ("gate/up gathered", gate_up.clone(), "moe_gate_up_q_wg"),
            ("gate/up grouped", gate_up, "moe_gate_up_grouped_q_wg"),
            ("down gathered", down.clone(), "moe_down_q_wg"),
            ("down grouped", down, "moe_down_grouped_q_wg"),
        ];
        time_interleaved(&gpu, cases.into_iter().map(|(name, p, id)| (name, p, DType::Q4_K, find(id).expect("registered"))).collect(), 10);
    }
}
