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

use super::stats::{Stats, summarize};
use crate::gpu::{GpuCtx, GpuProgram};
use crate::kernels::verify::{GpuBuffers, HostTensor, make_inputs, output_lens};
use crate::kernels::{CpuArgs, DType, KernelDef, Params, Problem};

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
/// On the CPU each shape's inputs come in enough copies to overflow the last-level
/// cache (`rotate_bytes`), and consecutive executions cycle through them, as
/// PyTorch TunableOp's rotating buffers do: in a model pass every layer reads its
/// own weights and KV cache from memory, so a kernel timed over one hot copy would
/// be ranked at cache speed (a 576×576 GEMV fits in L2) rather than at the speed
/// the pass sees.
pub struct Workload {
    pub dtype: DType,
    pub shapes: Vec<(Problem, usize)>,
    /// Per shape, its input copies (one at least).
    inputs: Vec<Vec<Vec<HostTensor>>>,
    gpu: Option<(Arc<GpuCtx>, Vec<GpuBuffers>)>,
}

/// Copies of `bytes` of inputs that together reach `rotate_bytes` (at most 256).
pub fn rotating_copies(bytes: usize, rotate_bytes: usize) -> usize {
    if bytes == 0 { 1 } else { rotate_bytes.div_ceil(bytes).clamp(1, 256) }
}

impl Workload {
    pub fn new(shapes: Vec<(Problem, usize)>, dtype: DType, gpu: Option<Arc<GpuCtx>>, seed: u64, rotate_bytes: usize) -> Workload {
        let inputs: Vec<Vec<Vec<HostTensor>>> = shapes
            .iter()
            .map(|(p, _)| {
                let first = make_inputs(p, dtype, seed);
                let bytes: usize = first.iter().map(|t| t.bytes().len()).sum();
                let n = if gpu.is_some() { 1 } else { rotating_copies(bytes, rotate_bytes) };
                let mut all = vec![first; n];
                all.shrink_to_fit();
                all
            })
            .collect();
        let gpu = gpu.map(|ctx| {
            let bufs = shapes.iter().zip(&inputs).map(|((p, _), ins)| GpuBuffers::new(&ctx, p, dtype, &ins[0])).collect();
            (ctx, bufs)
        });
        Workload { dtype, shapes, inputs, gpu }
    }

    /// Input copies of shape `i`.
    pub fn copies(&self, i: usize) -> usize {
        self.inputs[i].len()
    }
}

/// A candidate prepared to run: output buffers (CPU) or programs (GPU), and the
/// calibrated repetitions per shape.
pub struct Runner {
    pub cand: Cand,
    outs: Vec<Vec<Vec<f32>>>,
    progs: Vec<GpuProgram>,
    reps: Vec<u32>,
    pub samples: Vec<f64>,
    /// Per-shape seconds of each sample.
    pub shape_samples: Vec<Vec<f64>>,
    pub dropped: Option<usize>,
    pub error: Option<String>,
    pub timestamps: bool,
    /// The input copy the next CPU execution reads (cycles through the copies).
    next_copy: usize,
}

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
                for ((p, _), b) in w.shapes.iter().zip(bufs) {
                    let prog = k.prepare_wgsl(ctx, p, w.dtype, &self.cand.params, &b.refs()).map_err(|e| e.to_string())?;
                    self.progs.push(prog);
                }
            }
        }
        // Warm up once per shape and calibrate repetitions.
        for i in 0..w.shapes.len() {
            let t = self.time_shape(w, i, 1)?;
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
                {
                    let t0 = Instant::now();
                    for _ in 0..reps {
                        *next = (*next + 1) % copies.len();
                        let args = CpuArgs {
                            ins: copies[*next].iter().map(HostTensor::as_in).collect(),
                            outs: outs.iter_mut().map(|v| v.as_mut_slice()).collect(),
                        };
                        k.run_cpu(p, w.dtype, params, args).map_err(|e| e.to_string())?;
                    }
                    Ok(t0.elapsed().as_secs_f64() / reps as f64)
                }
            }
            Some((ctx, _)) => {
                let prog = &self.progs[i];
                if let Some(t) = ctx.time_program(prog, reps).map_err(|e| e.to_string())? {
                    return Ok(t);
                }
                let all: Vec<&GpuProgram> = (0..reps).map(|_| prog).collect();
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
}

/// Samples per candidate in each round of a race (halving and racing between rounds).
pub fn rounds(strategy: Strategy) -> &'static [usize] {
    match strategy {
        Strategy::Exhaustive | Strategy::Random => &[3, 3, 3],
        Strategy::Halving | Strategy::Auto => &[1, 2, 3, 3],
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
    deadline: Instant,
    seed: u64,
    first_round: usize,
    mut tick: impl FnMut(usize),
) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let rounds = rounds(strategy);
    for (round, &per) in rounds.iter().enumerate() {
        let mut alive: Vec<usize> = (0..runners.len()).filter(|&i| runners[i].dropped.is_none() && runners[i].error.is_none()).collect();
        for _ in 0..per {
            alive.shuffle(&mut rng);
            for &i in &alive {
                // Past the deadline, only candidates without any sample still get one.
                if Instant::now() > deadline && !runners[i].samples.is_empty() {
                    continue;
                }
                runners[i].sample(w);
                tick(i);
            }
        }
        if Instant::now() > deadline {
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
}
