//! The token sampler, described once for the CPU and the GPU: its parameters
//! ([`SamplerParams`]), the counter-based random numbers (Philox4x32-10), the
//! integer weights and the decision rules, the CPU implementation ([`Sampler`]),
//! and the WGSL program ([`gpu`], `shaders/sample.wgsl`) that takes the same
//! decisions without a host round trip.
//!
//! # The chain, in llama.cpp's order
//!
//! 1. **Repeat penalty** on the logits of the distinct ids among the last
//!    `repeat_last_n` sampled ids: a positive logit is multiplied by
//!    `1 / repeat_penalty` (the reciprocal rounded once to f32 on the host, where
//!    llama.cpp divides: at most one ulp apart), a non-positive one by
//!    `repeat_penalty`. Applied before greedy too.
//! 2. **Greedy** (`temperature` 0): the first index of the maximum. It is also the
//!    answer whenever the maximum is `-inf` (every logit `-inf` or NaN) or `+inf`.
//! 3. **Top-k** (`top_k` > 0): the `k` first tokens in the *order*: logit
//!    descending, then index ascending (a total order: ties keep the lower ids).
//! 4. **Top-p** (`top_p` < 1): the shortest prefix of the order (within top-k)
//!    whose weight at temperature 1 reaches `top_p` of the top-k tokens' weight: a
//!    token is kept while the weight before it is below `top_p` of the total, so the
//!    token that crosses it is kept, and the first always is.
//! 5. **Min-p** (`min_p` > 0): tokens whose logit is at least `max + ln(min_p)`.
//! 6. **Temperature and the draw**: weights at temperature `T` over the tokens
//!    kept; step `s` draws `r`, the first word of Philox4x32-10 with key = the seed
//!    and counter = `(s, 0, 0, 0)` (`s` = the tokens sampled so far in this
//!    generation), i.e. `u = r / 2^32` uniform in [0, 1); the target is
//!    `floor(u * total)` and the token is the first, **in index order**, whose
//!    cumulative weight exceeds it (the same distribution as a draw in the sorted
//!    order, and a prefix sum over ids is what a GPU does without a sort).
//!
//! # Why the CPU and the GPU agree, bit for bit
//!
//! Every decision is made on values both sides compute identically, so a CPU that
//! sorts and a GPU that selects by radix reach the same id:
//! - logits are read as bits and *canonicalized*: NaN becomes `-inf`, zero and
//!   subnormals become `+0` (a GPU may flush subnormals; here both do);
//! - the order compares integer keys ([`order_key`]), never floats;
//! - the only float arithmetic is single correctly rounded IEEE operations with no
//!   multiply feeding an add (a driver may contract `a * b + c` into an FMA): the
//!   penalty's multiply (in its own dispatch on the GPU, its result stored before
//!   anything reads it), `d = x - max`, `d * scale`, and a comparison;
//! - weights are integers: `w = 2^24 * 2^(-y)` for `y = -d * log2(e) / T`,
//!   with `y` in 1/65536 steps, its fractional power by a degree-8 polynomial in
//!   u32 fixed point ([`EXP2_COEFFS`], Horner with a 32x32 high multiply) and its
//!   integer power by a shift; weights below 2^-24 of the maximum's are 0;
//! - sums are exact integers (u64 on the CPU, u32 pairs on the GPU), so their order
//!   of summation does not matter, and thresholds are integer comparisons
//!   (`top_p` as `round(top_p * 2^24)`, the top-p limit `ceil(total * p / 2^24)`,
//!   the draw's target `floor(r * total / 2^32)`).
//!
//! Guarantee (tested on lavapipe against this module): for the same logits,
//! parameters, seed, step and penalty history, the GPU program returns the same id
//! as [`Sampler::sample`], on any adapter whose f32 add, subtract and multiply are
//! correctly rounded (Vulkan requires it) and that does not fuse the penalty's
//! multiply across a dispatch boundary (none can).
//!
//! # The GPU program
//!
//! Three dispatches, no host step: `prep` copies the logits canonicalized into a
//! scratch buffer (a grid over the vocabulary); `penalty` (one workgroup) applies
//! the repeat penalty to the history's distinct ids there; `pick` (one workgroup
//! of 256) finds the maximum, then the top-k and top-p cutoffs by a radix select
//! over the 64-bit order key (8-bit digits: a workgroup histogram of counts, and of
//! weights for top-p, per round; index rounds the vocabulary cannot reach are
//! skipped), then draws with per-invocation chunk sums and one scan, writes the id,
//! advances the step and appends the id to the penalty history, all in a small
//! state buffer ([`SamplerState`]) the GPU owns between tokens. A radix select
//! takes a fixed number of passes over the vocabulary (at most 8 per cutoff) and
//! no sort, which a bisection over float thresholds would not bound, and keeps
//! every comparison on integers. Greedy is one pass.

pub mod gpu;
#[cfg(test)]
mod tests;

use serde::Serialize;

/// The sampling parameters (llama.cpp's names and meanings).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SamplerParams {
    /// 0: greedy (the first maximum); else the softmax temperature.
    pub temperature: f32,
    /// Keep the `top_k` first tokens of the order; 0: off.
    pub top_k: u32,
    /// Keep the shortest prefix holding this share of the weight; 1: off.
    pub top_p: f32,
    /// Keep tokens with probability at least `min_p` times the top one's; 0: off.
    pub min_p: f32,
    /// Divide positive logits (multiply the others) of recently sampled ids; 1: off.
    pub repeat_penalty: f32,
    /// How many of the last sampled ids the penalty looks at (at most
    /// [`MAX_REPEAT_LAST_N`]).
    pub repeat_last_n: u32,
    /// The Philox key.
    pub seed: u64,
}

/// The longest penalty history.
pub const MAX_REPEAT_LAST_N: u32 = 4096;

impl SamplerParams {
    /// Greedy decoding, the other filters at llama.cpp's defaults.
    pub const GREEDY: SamplerParams =
        SamplerParams { temperature: 0.0, top_k: 40, top_p: 0.95, min_p: 0.05, repeat_penalty: 1.0, repeat_last_n: 64, seed: 0 };

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Checks every value's range; the error names the parameter (its snake_case
    /// name, as the command-line flag spells it with dashes).
    pub fn validate(&self) -> Result<(), SampleError> {
        let bad = |name: &'static str, value: String, rule: &'static str| Err(SampleError::Param { name, value, rule });
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return bad("temperature", t.to_string(), "a finite number >= 0 (0 = greedy)");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", self.top_p.to_string(), "in (0, 1] (1 = off)");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", self.min_p.to_string(), "in [0, 1] (0 = off)");
        }
        let r = self.repeat_penalty;
        if !(r.is_finite() && r > 0.0) {
            return bad("repeat_penalty", r.to_string(), "a finite number > 0 (1 = off)");
        }
        if self.repeat_last_n > MAX_REPEAT_LAST_N {
            return bad("repeat_last_n", self.repeat_last_n.to_string(), "at most 4096 (0 = off)");
        }
        Ok(())
    }

    /// The values both implementations use, computed once on the host.
    pub fn derived(&self) -> Derived {
        let log2e = std::f64::consts::LOG2_E;
        let scale = |t: f64| (-(log2e / t) * 65536.0).max(-(f32::MAX as f64)) as f32;
        let penalty_on = self.repeat_penalty != 1.0 && self.repeat_last_n > 0;
        Derived {
            greedy: self.is_greedy(),
            top_k: self.top_k,
            top_p_q: if self.top_p < 1.0 { ((self.top_p as f64 * Q24 as f64).round() as u32).min(Q24) } else { Q24 },
            neg_scale_p: scale(1.0),
            neg_scale_t: if self.is_greedy() { 0.0 } else { scale(self.temperature as f64) },
            ln_min_p: if self.min_p > 0.0 { (self.min_p as f64).ln() as f32 } else { f32::NEG_INFINITY },
            penalty: self.repeat_penalty,
            inv_penalty: (1.0 / self.repeat_penalty as f64) as f32,
            last_n: if penalty_on { self.repeat_last_n } else { 0 },
        }
    }
}

/// Errors of the sampler's parameters and of its GPU program.
#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    #[error("`{name}` = {value} is out of range: it must be {rule}")]
    Param { name: &'static str, value: String, rule: &'static str },
    #[error("sampler: {0}")]
    Buffer(String),
    #[error(transparent)]
    Gpu(#[from] crate::gpu::GpuError),
}

/// 2^24: the weight of the maximum, and `top_p` = 1.
pub const Q24: u32 = 1 << 24;

/// What [`SamplerParams::derived`] computes for both implementations.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Derived {
    pub greedy: bool,
    /// 0: off.
    pub top_k: u32,
    /// `round(top_p * 2^24)`; [`Q24`]: off.
    pub top_p_q: u32,
    /// `-log2(e) * 65536`: the weights of top-p (temperature 1).
    pub neg_scale_p: f32,
    /// `-log2(e) / T * 65536`: the weights of the draw.
    pub neg_scale_t: f32,
    /// `ln(min_p)`; `-inf`: off.
    pub ln_min_p: f32,
    pub penalty: f32,
    pub inv_penalty: f32,
    /// Penalty history length; 0: no penalty.
    pub last_n: u32,
}

// ---- The primitives both sides write out (shaders/sample.wgsl mirrors each) ----

/// The high and low words of `a * b` (the WGSL side builds them from 16-bit halves).
#[inline]
pub fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = a as u64 * b as u64;
    ((p >> 32) as u32, p as u32)
}

const PHILOX_M: [u32; 2] = [0xD251_1F53, 0xCD9E_8D57];
const PHILOX_W: [u32; 2] = [0x9E37_79B9, 0xBB67_AE85];

/// Philox4x32-10 (Salmon et al., SC'11, as Random123 defines it).
pub fn philox4x32_10(ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut x, mut k) = (ctr, key);
    for _ in 0..10 {
        let (hi0, lo0) = mulhilo(PHILOX_M[0], x[0]);
        let (hi1, lo1) = mulhilo(PHILOX_M[1], x[2]);
        x = [hi1 ^ x[1] ^ k[0], lo1, hi0 ^ x[3] ^ k[1], lo0];
        k = [k[0].wrapping_add(PHILOX_W[0]), k[1].wrapping_add(PHILOX_W[1])];
    }
    x
}

/// The 32 random bits of step `step` under `seed`.
pub fn random_bits(seed: u64, step: u32) -> u32 {
    philox4x32_10([step, 0, 0, 0], [seed as u32, (seed >> 32) as u32])[0]
}

/// The uniform number in [0, 1) of step `step` under `seed`: `random_bits / 2^32`.
pub fn uniform(seed: u64, step: u32) -> f64 {
    random_bits(seed, step) as f64 / 4_294_967_296.0
}

/// `round(ln(2)^k / k! * 2^30)`, k = 0..=8: `2^t` for t in [0, 1) in Q30.
pub const EXP2_COEFFS: [u32; 9] = [1073741824, 744261118, 257941248, 59597083, 10327387, 1431680, 165394, 16377, 1419];

/// `2^(-f / 65536)` in Q31 for `f` in [0, 65536): `2^t` in Q30 with `t = 1 - f/65536`.
pub fn exp2_neg_q31(f: u32) -> u32 {
    if f == 0 {
        return 1 << 31;
    }
    let t = (65536 - f) << 16;
    let mut p = EXP2_COEFFS[8];
    for k in (0..8).rev() {
        p = EXP2_COEFFS[k] + mulhilo(p, t).0;
    }
    p
}

/// `y` in 1/65536 steps past which a weight is 0 (2^-24 of the maximum's).
const WEIGHT_CAP: f32 = 24.0 * 65536.0;

/// [`exp2_neg_q31`] of every `f`, computed once: the CPU reads the polynomial's
/// values from a 256 KiB table instead of evaluating it per token (the same bits).
fn exp2_table() -> &'static [u32] {
    static TABLE: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| (0..65536).map(exp2_neg_q31).collect())
}

/// The integer weight of a token `d = x - max` (<= 0) below the maximum, at the
/// scale `neg_scale` ([`Derived::neg_scale_p`] or [`Derived::neg_scale_t`]):
/// `2^24 * 2^(-y)`, y = `d * neg_scale / 65536`, 0 past 24 halvings.
pub fn weight(d: f32, neg_scale: f32) -> u32 {
    let p = d * neg_scale;
    if p.is_nan() || p >= WEIGHT_CAP {
        return 0;
    }
    let q = p as u32;
    exp2_table()[(q & 0xFFFF) as usize] >> ((q >> 16) + 7)
}

/// NaN as `-inf`, zero and subnormals as `+0`, else the value: what both sides
/// read a logit as.
#[inline]
pub fn canon(bits: u32) -> f32 {
    if bits & 0x7FFF_FFFF > 0x7F80_0000 {
        f32::NEG_INFINITY
    } else if bits & 0x7F80_0000 == 0 {
        0.0
    } else {
        f32::from_bits(bits)
    }
}

/// A canonical value ([`canon`]) as an unsigned key in the same order.
#[inline]
pub fn value_key(x: f32) -> u32 {
    let b = x.to_bits();
    if b & 0x8000_0000 != 0 { !b } else { b | 0x8000_0000 }
}

/// The position key of a token in the order (logit descending, index ascending):
/// smaller comes first.
#[inline]
pub fn order_key(x: f32, i: u32) -> u64 {
    ((!value_key(x) as u64) << 32) | i as u64
}

/// The repeat penalty of one canonical logit.
#[inline]
pub fn penalize(x: f32, d: &Derived) -> f32 {
    let y = if x > 0.0 { x * d.inv_penalty } else { x * d.penalty };
    canon(y.to_bits())
}

/// `x - max` with a subnormal difference as 0 (a GPU may flush it).
#[inline]
fn below_max(x: f32, max: f32) -> f32 {
    canon((x - max).to_bits())
}

/// Index of the largest logit, the first on ties (greedy decoding), NaN read as
/// `-inf` and subnormals as 0 ([`canon`]); 0 for an empty row.
///
/// Sixteen independent lanes (lane `l` sees elements `l, l + 16, …`), each
/// keeping its largest key and the first index it was seen at, then the lanes
/// merged (the largest key, the smallest index among equal keys) and the tail:
/// the one loop's answer, in an AVX-512 register where the CPU has it, else in
/// branch-free portable lanes (a server decodes 8–16 sequences a step, each
/// argmax over the whole vocabulary on the engine's thread while the pool
/// waits).
pub fn argmax(row: &[f32]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::cpu::features().avx512f {
        // SAFETY: AVX-512F detected.
        return unsafe { argmax_avx512(row) };
    }
    let (key, at) = argmax_lanes(row);
    merge_lanes(row, key, at)
}

/// `value_key(canon(bits))` in integer operations and selects.
#[inline(always)]
fn key_of(bits: u32) -> u32 {
    let nan = 0u32.wrapping_sub(u32::from(bits & 0x7FFF_FFFF > 0x7F80_0000));
    let flush = 0u32.wrapping_sub(u32::from(bits & 0x7F80_0000 == 0));
    let c = (bits & !nan & !flush) | (f32::NEG_INFINITY.to_bits() & nan);
    let neg = 0u32.wrapping_sub(c >> 31);
    (c ^ neg) | (!neg & 0x8000_0000)
}

/// Lanes of [`argmax`].
const ARGMAX_LANES: usize = 16;

/// Each lane's largest key over the whole chunks and the first index it was
/// seen at (portable: the compiler vectorises what it can).
fn argmax_lanes(row: &[f32]) -> ([u32; ARGMAX_LANES], [u32; ARGMAX_LANES]) {
    const L: usize = ARGMAX_LANES;
    let (mut key, mut at) = ([0u32; L], [0u32; L]);
    for (c, chunk) in row.chunks_exact(L).enumerate() {
        for l in 0..L {
            let k = key_of(chunk[l].to_bits());
            let better = k > key[l];
            key[l] = if better { k } else { key[l] };
            at[l] = if better { (c * L + l) as u32 } else { at[l] };
        }
    }
    (key, at)
}

/// [`argmax_lanes`] in AVX-512 registers: a lane of the register per lane.
///
/// # Safety
/// AVX-512F available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn argmax_avx512(row: &[f32]) -> u32 {
    use std::arch::x86_64::*;
    let (mut key, mut at) = (_mm512_setzero_si512(), _mm512_setzero_si512());
    let mut index = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let step = _mm512_set1_epi32(ARGMAX_LANES as i32);
    let (magnitude, exponent) = (_mm512_set1_epi32(0x7FFF_FFFF), _mm512_set1_epi32(0x7F80_0000));
    let (neg_inf, sign) = (_mm512_set1_epi32(f32::NEG_INFINITY.to_bits() as i32), _mm512_set1_epi32(i32::MIN));
    for chunk in row.chunks_exact(ARGMAX_LANES) {
        // SAFETY: 16 readable floats.
        let b = unsafe { _mm512_loadu_si512(chunk.as_ptr() as *const __m512i) };
        // key_of, lane by lane.
        let nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, magnitude), exponent);
        let flush = _mm512_testn_epi32_mask(b, exponent);
        let c = _mm512_mask_mov_epi32(_mm512_maskz_mov_epi32(!flush, b), nan, neg_inf);
        let neg = _mm512_srai_epi32::<31>(c);
        let k = _mm512_or_si512(_mm512_xor_si512(c, neg), _mm512_andnot_si512(neg, sign));
        let better = _mm512_cmpgt_epu32_mask(k, key);
        key = _mm512_mask_mov_epi32(key, better, k);
        at = _mm512_mask_mov_epi32(at, better, index);
        index = _mm512_add_epi32(index, step);
    }
    let (mut keys, mut ats) = ([0u32; ARGMAX_LANES], [0u32; ARGMAX_LANES]);
    // SAFETY: 16 writable words each.
    unsafe {
        _mm512_storeu_si512(keys.as_mut_ptr() as *mut __m512i, key);
        _mm512_storeu_si512(ats.as_mut_ptr() as *mut __m512i, at);
    }
    merge_lanes(row, keys, ats)
}

/// The lanes merged (the largest key, the smallest index among equal keys),
/// then the elements after the whole chunks: the one loop's answer.
fn merge_lanes(row: &[f32], key: [u32; ARGMAX_LANES], at: [u32; ARGMAX_LANES]) -> u32 {
    let mut best = (0u32, 0u32);
    for l in 0..ARGMAX_LANES {
        if key[l] > best.0 || (key[l] == best.0 && at[l] < best.1) {
            best = (key[l], at[l]);
        }
    }
    let tail = row.len() - row.len() % ARGMAX_LANES;
    for (i, &v) in row[tail..].iter().enumerate() {
        let k = key_of(v.to_bits());
        if k > best.0 {
            best = (k, (tail + i) as u32);
        }
    }
    best.1
}

/// Where a generation stands: the step (tokens sampled so far) and the ring of the
/// last ids for the penalty. The GPU program keeps the same words in its state
/// buffer ([`SamplerState::words`]): step, length, head, capacity, then the ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SamplerState {
    pub step: u32,
    len: u32,
    head: u32,
    ring: Vec<u32>,
}

/// Words before the ring in the state buffer.
pub const STATE_HEADER_WORDS: usize = 4;

impl SamplerState {
    /// A new generation with a history of `capacity` ids ([`Derived::last_n`]).
    pub fn new(capacity: u32) -> SamplerState {
        SamplerState { step: 0, len: 0, head: 0, ring: vec![0; capacity as usize] }
    }

    /// The ids the penalty looks at (in ring order: the order does not matter).
    pub fn history(&self) -> &[u32] {
        &self.ring[..self.len as usize]
    }

    /// Records a sampled id: the step advances, the id enters the history.
    pub fn push(&mut self, id: u32) {
        self.step = self.step.wrapping_add(1);
        let cap = self.ring.len() as u32;
        if cap > 0 {
            self.ring[self.head as usize] = id;
            self.head = (self.head + 1) % cap;
            self.len = (self.len + 1).min(cap);
        }
    }

    /// The state buffer's words.
    pub fn words(&self) -> Vec<u32> {
        let mut w = vec![self.step, self.len, self.head, self.ring.len() as u32];
        w.extend_from_slice(&self.ring);
        w
    }

    /// A state read back from the buffer's words (`None` when they are not one).
    pub fn from_words(w: &[u32]) -> Option<SamplerState> {
        let [step, len, head, cap] = *w.get(..STATE_HEADER_WORDS)? else { return None };
        let ring = w.get(STATE_HEADER_WORDS..STATE_HEADER_WORDS + cap as usize)?.to_vec();
        (len <= cap && (cap == 0 || head < cap)).then_some(SamplerState { step, len, head, ring })
    }
}

/// The CPU sampler: parameters, the generation's state and reusable scratch.
pub struct Sampler {
    params: SamplerParams,
    derived: Derived,
    pub state: SamplerState,
    xs: Vec<f32>,
    keys: Vec<u64>,
    /// The history's distinct ids.
    seen: Vec<u32>,
    /// (key or id, weight) pairs: top-p's tokens, then the draw's.
    weighted: Vec<(u64, u32)>,
}

impl Sampler {
    /// A sampler at step 0 with an empty history (parameters as given: call
    /// [`SamplerParams::validate`] on user input first).
    pub fn new(params: SamplerParams) -> Sampler {
        let derived = params.derived();
        Sampler {
            params,
            derived,
            state: SamplerState::new(derived.last_n),
            xs: Vec::new(),
            keys: Vec::new(),
            seen: Vec::new(),
            weighted: Vec::new(),
        }
    }

    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// Samples one id from `logits` and records it (the step advances).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let id = self.pick(logits);
        self.state.push(id);
        id
    }

    /// Whether this sampler is the plain argmax (greedy, no penalty history): the
    /// selection a GPU engine makes itself (`Engine::decode_next`), after which
    /// [`Sampler::record`] keeps this sampler's state.
    pub fn is_argmax(&self) -> bool {
        self.derived.greedy && self.derived.last_n == 0
    }

    /// Records `id`, chosen elsewhere by this sampler's rule, as its next sample.
    pub fn record(&mut self, id: u32) {
        self.state.push(id);
    }

    /// The id [`Sampler::sample`] would return, without recording it.
    pub fn pick(&mut self, logits: &[f32]) -> u32 {
        let d = self.derived;
        let v = logits.len();
        if self.is_argmax() {
            return argmax(logits);
        }
        // 1. canonical logits with the penalty on the history's distinct ids
        self.xs.clear();
        self.xs.extend(logits.iter().map(|x| canon(x.to_bits())));
        self.seen.clear();
        self.seen.extend(self.state.history().iter().copied().filter(|&id| (id as usize) < v));
        self.seen.sort_unstable();
        self.seen.dedup();
        for &id in &self.seen {
            self.xs[id as usize] = penalize(self.xs[id as usize], &d);
        }
        let xs = &self.xs;
        // 2. greedy, or a maximum that is not finite
        let imax = argmax(xs);
        let Some(&max) = xs.get(imax as usize) else { return 0 };
        if d.greedy || !max.is_finite() {
            return imax;
        }
        // 3. top-k: the k-th key of the order
        let top_k = d.top_k > 0 && (d.top_k as usize) < v;
        let top_p = d.top_p_q < Q24;
        self.keys.clear();
        if top_k || top_p {
            self.keys.extend(xs.iter().enumerate().map(|(i, &x)| order_key(x, i as u32)));
        }
        let mut cut = u64::MAX;
        if top_k {
            let k = d.top_k as usize;
            self.keys.select_nth_unstable(k - 1);
            self.keys.truncate(k);
            cut = self.keys[k - 1];
        }
        // 4. top-p over the top-k tokens, in order (zero weights sort last and
        // never end a prefix, so only the positive ones are sorted)
        if top_p {
            self.weighted.clear();
            let mut total = 0u64;
            for &k in &self.keys {
                let w = weight(below_max(xs[k as u32 as usize], max), d.neg_scale_p);
                total += w as u64;
                if w > 0 {
                    self.weighted.push((k, w));
                }
            }
            let limit = (((total as u128 * d.top_p_q as u128) + (Q24 as u128 - 1)) >> 24).max(1) as u64;
            self.weighted.sort_unstable_by_key(|&(k, _)| k);
            // the last token whose weight before it is below the limit
            let (mut before, mut last) = (0u64, 0u64);
            for &(k, w) in &self.weighted {
                if before >= limit {
                    break;
                }
                last = k;
                before += w as u64;
            }
            cut = cut.min(last);
            self.keys.clear();
            self.keys.extend(self.weighted.iter().map(|&(k, _)| k).take_while(|&k| k <= cut));
        }
        // 5. min-p, 6. the draw over the kept tokens in index order
        let kept_key = |x: f32, i: u32| order_key(x, i) <= cut && below_max(x, max) >= d.ln_min_p;
        self.weighted.clear();
        let ids: &mut dyn Iterator<Item = u32> = if top_k || top_p {
            self.keys.sort_unstable_by_key(|&k| k as u32);
            &mut self.keys.iter().map(|&k| k as u32)
        } else {
            &mut (0..v as u32)
        };
        let mut total = 0u64;
        for i in ids.filter(|&i| kept_key(xs[i as usize], i)) {
            let w = weight(below_max(xs[i as usize], max), d.neg_scale_t);
            total += w as u64;
            self.weighted.push((i as u64, w));
        }
        let target = ((random_bits(self.params.seed, self.state.step) as u128 * total as u128) >> 32) as u64;
        let mut cum = 0u64;
        for &(i, w) in &self.weighted {
            cum += w as u64;
            if cum > target {
                return i as u32;
            }
        }
        imax
    }
}
