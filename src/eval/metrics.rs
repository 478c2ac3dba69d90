//! The numbers of an evaluation, each defined once: log-probabilities of a logits
//! row, perplexity (exp of the mean negative log-likelihood of the next token,
//! with llama-perplexity's uncertainty), and the divergence of a model from a
//! reference at the same positions: KL divergence KL(reference ‖ model) per
//! position (mean, median, 99th percentile, maximum), top-1 agreement, and the
//! relative RMS error of the logits. Every sum is in f64; the log-probabilities
//! both sides hand in are f32, as a saved logits file keeps them, so an in-process
//! reference and the same reference read back from an f32 file give the same
//! figures bit for bit (`tools/kld_check.py` recomputes them from two files).

use serde::Serialize;

/// The log-probabilities of a logits row (`log_softmax`, computed in f64), into
/// `out`. A row with a NaN or an infinity gives `false` and leaves `out` unspecified.
pub fn log_softmax(logits: &[f32], out: &mut Vec<f32>) -> bool {
    out.clear();
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    if !max.is_finite() || logits.iter().any(|v| !v.is_finite()) {
        return false;
    }
    let max = max as f64;
    let sum: f64 = logits.iter().map(|&v| (v as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    out.extend(logits.iter().map(|&v| (v as f64 - lse) as f32));
    true
}

/// Index of the largest value (the first on ties).
pub fn top1(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// Accumulates the negative log-likelihood of each scored position's next token.
#[derive(Clone, Debug, Default)]
pub struct NllSum {
    sum: f64,
    sum_sq: f64,
    count: usize,
}

impl NllSum {
    /// One position: `logp` its log-probabilities, `next` the token that follows it.
    pub fn add(&mut self, logp: &[f32], next: u32) {
        let nll = -(logp[next as usize] as f64);
        self.sum += nll;
        self.sum_sq += nll * nll;
        self.count += 1;
    }

    /// Perplexity `exp(mean NLL)`, with llama-perplexity's uncertainty
    /// (`ppl × the standard error of the mean NLL`).
    pub fn finish(&self) -> Perplexity {
        let n = self.count.max(1) as f64;
        let mean = self.sum / n;
        let var = (self.sum_sq / n - mean * mean).max(0.0);
        let se = if self.count > 1 { (var / (n - 1.0)).sqrt() } else { 0.0 };
        let ppl = mean.exp();
        Perplexity { ppl, ppl_stderr: ppl * se, nll_mean: mean, positions: self.count }
    }
}

/// Perplexity over the scored positions.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Perplexity {
    pub ppl: f64,
    /// `ppl` times the standard error of the mean NLL (llama-perplexity's `±`).
    pub ppl_stderr: f64,
    /// Mean negative log-likelihood (nats per token).
    pub nll_mean: f64,
    pub positions: usize,
}

/// Accumulates a model's divergence from a reference, position by position.
#[derive(Clone, Debug, Default)]
pub struct DivergenceSum {
    kld: Vec<f64>,
    same_top1: usize,
    err_sq: f64,
    ref_sq: f64,
}

impl DivergenceSum {
    /// One position: the reference's and the model's log-probabilities.
    pub fn add(&mut self, reference: &[f32], model: &[f32]) {
        let n = reference.len().max(1) as f64;
        let mean_r = reference.iter().map(|&v| v as f64).sum::<f64>() / n;
        let mean_m = model.iter().map(|&v| v as f64).sum::<f64>() / n;
        let (mut kld, mut err_sq, mut ref_sq) = (0.0, 0.0, 0.0);
        for (&r, &m) in reference.iter().zip(model) {
            let (r, m) = (r as f64, m as f64);
            kld += r.exp() * (r - m);
            // Log-probabilities are logits less a per-row constant: centred, they
            // are the centred logits.
            let (cr, cm) = (r - mean_r, m - mean_m);
            err_sq += (cm - cr) * (cm - cr);
            ref_sq += cr * cr;
        }
        self.kld.push(kld);
        self.same_top1 += usize::from(top1(reference) == top1(model));
        self.err_sq += err_sq;
        self.ref_sq += ref_sq;
    }

    /// The statistics over every position added.
    pub fn finish(&self) -> Divergence {
        let mut sorted = self.kld.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        Divergence {
            kld_mean: if n == 0 { 0.0 } else { sorted.iter().sum::<f64>() / n as f64 },
            kld_median: quantile(&sorted, 0.5),
            kld_p99: quantile(&sorted, 0.99),
            kld_max: sorted.last().copied().unwrap_or(0.0),
            top1_agreement_pct: if n == 0 { 0.0 } else { 100.0 * self.same_top1 as f64 / n as f64 },
            rel_rms_logit_error: if self.ref_sq > 0.0 { (self.err_sq / self.ref_sq).sqrt() } else { 0.0 },
            positions: n,
        }
    }
}

/// The `q` quantile of sorted values, interpolated linearly between the two
/// nearest ranks (numpy's default `percentile`).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// A model against a reference over the same positions.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Divergence {
    /// Mean KL(reference ‖ model) per position, nats.
    pub kld_mean: f64,
    pub kld_median: f64,
    pub kld_p99: f64,
    pub kld_max: f64,
    /// Positions where both put the most probability on the same token, percent.
    pub top1_agreement_pct: f64,
    /// `sqrt(Σ(model − reference)² / Σ reference²)` over every position's logits,
    /// each row centred (its mean taken out), which makes logits and
    /// log-probabilities the same thing.
    pub rel_rms_logit_error: f64,
    pub positions: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_normalizes_and_refuses_nan() {
        let mut out = Vec::new();
        assert!(log_softmax(&[1.0, 2.0, 3.0], &mut out));
        let total: f64 = out.iter().map(|&v| (v as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        assert!((out[2] - out[1] - 1.0).abs() < 1e-6);
        assert!(!log_softmax(&[1.0, f32::NAN], &mut out));
    }

    #[test]
    fn kld_is_zero_against_itself_and_positive_otherwise() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        log_softmax(&[0.5, 1.5, -2.0, 0.0], &mut a);
        log_softmax(&[0.5, 1.0, -2.0, 0.3], &mut b);
        let mut same = DivergenceSum::default();
        same.add(&a, &a);
        let d = same.finish();
        assert_eq!((d.kld_mean, d.top1_agreement_pct, d.rel_rms_logit_error), (0.0, 100.0, 0.0));
        let mut other = DivergenceSum::default();
        other.add(&a, &b);
        // KL(a‖b) by hand.
        let want: f64 = a.iter().zip(&b).map(|(&p, &q)| (p as f64).exp() * (p as f64 - q as f64)).sum();
        let d = other.finish();
        assert!(d.kld_mean > 0.0 && (d.kld_mean - want).abs() < 1e-12, "{d:?} vs {want}");
        assert_eq!(d.top1_agreement_pct, 100.0);
    }

    #[test]
    fn quantiles_interpolate_like_numpy() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&v, 0.5), 2.5);
        assert!((quantile(&v, 0.99) - 3.97).abs() < 1e-12);
        assert_eq!(quantile(&v, 1.0), 4.0);
    }

    #[test]
    fn perplexity_of_a_uniform_guess_is_the_vocabulary() {
        let mut out = Vec::new();
        log_softmax(&[0.0; 8], &mut out);
        let mut s = NllSum::default();
        for t in 0..8 {
            s.add(&out, t);
        }
        let p = s.finish();
        assert!((p.ppl - 8.0).abs() < 1e-5, "{p:?}");
        assert!(p.ppl_stderr.abs() < 1e-6);
    }
}
