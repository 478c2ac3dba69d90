//! Robust statistics of timing samples: outliers rejected by median absolute
//! deviation, median with a distribution-free 95% confidence interval (order
//! statistics of the binomial), and the tie rule that keeps choices deterministic.
//! Neutral ground: the tuner's races, `bench`'s estimates and the profile's
//! records ([`crate::profile::build`]) all summarize samples here.

use serde::{Deserialize, Serialize};

/// Summary of one candidate's samples (seconds).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub median: f64,
    pub ci: [f64; 2],
    pub mad: f64,
    pub n: usize,
    pub outliers: usize,
}

fn median_sorted(v: &[f64]) -> f64 {
    let n = v.len();
    if n == 0 {
        return f64::INFINITY;
    }
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

/// Samples farther than 3.5 scaled MADs from the median are outliers (Iglewicz and
/// Hoaglin's modified z-score); they are dropped before the median and interval.
pub fn summarize(samples: &[f64]) -> Stats {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return Stats { median: f64::INFINITY, ci: [f64::INFINITY; 2], mad: 0.0, n: 0, outliers: 0 };
    }
    v.sort_by(f64::total_cmp);
    let m = median_sorted(&v);
    let mut dev: Vec<f64> = v.iter().map(|x| (x - m).abs()).collect();
    dev.sort_by(f64::total_cmp);
    let mad = median_sorted(&dev);
    let kept: Vec<f64> = if mad > 0.0 { v.iter().copied().filter(|x| 0.6745 * (x - m).abs() / mad <= 3.5).collect() } else { v.clone() };
    let outliers = v.len() - kept.len();
    let n = kept.len();
    let median = median_sorted(&kept);
    // 95% interval of the median from order statistics: ranks n/2 ± 1.96·√n/2.
    let half = 0.98 * (n as f64).sqrt();
    let lo = ((n as f64 / 2.0 - half).floor().max(0.0)) as usize;
    let hi = ((n as f64 / 2.0 + half).ceil() as usize).min(n - 1);
    Stats { median, ci: [kept[lo], kept[hi]], mad, n, outliers }
}

impl Stats {
    /// Whether `self` ties with `best`: medians within `rel` (relative) of each other.
    pub fn ties_with(&self, best: &Stats, rel: f64) -> bool {
        self.median <= best.median * (1.0 + rel)
    }

    /// Clearly slower than `best`: the interval lies wholly above best's.
    pub fn loses_to(&self, best: &Stats) -> bool {
        self.n >= 3 && best.n >= 3 && self.ci[0] > best.ci[1]
    }
}

/// Index of the winner among `stats` (in a fixed candidate order): the lowest median,
/// then among those within noise of it the earliest in the order, so runs on the
/// same machine pick the same candidate despite jitter.
pub fn pick(stats: &[Stats], rel: f64) -> Option<usize> {
    let best = (0..stats.len()).filter(|&i| stats[i].n > 0).min_by(|&a, &b| stats[a].median.total_cmp(&stats[b].median))?;
    (0..stats.len()).find(|&i| stats[i].n > 0 && stats[i].ties_with(&stats[best], rel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outliers_are_dropped_and_the_interval_brackets_the_median() {
        let mut s: Vec<f64> = (0..20).map(|i| 1.0 + (i % 5) as f64 * 0.01).collect();
        s.push(50.0);
        let st = summarize(&s);
        assert_eq!(st.outliers, 1);
        assert!(st.ci[0] <= st.median && st.median <= st.ci[1]);
        assert!((st.median - 1.02).abs() < 1e-9, "{st:?}");
    }

    #[test]
    fn ties_resolve_to_the_earliest_candidate() {
        let a = summarize(&[1.00, 1.01, 1.02, 1.00, 1.01]);
        let b = summarize(&[0.998, 1.0, 1.01, 1.0, 1.005]);
        let c = summarize(&[2.0, 2.1, 2.0, 2.05, 2.0]);
        assert_eq!(pick(&[c.clone(), a.clone(), b.clone()], 0.01), Some(1));
        assert_eq!(pick(&[b, a, c], 0.01), Some(0));
    }

    #[test]
    fn a_clearly_faster_candidate_wins_regardless_of_order() {
        let slow = summarize(&[1.0, 1.01, 1.02, 1.0, 1.01]);
        let fast = summarize(&[0.5, 0.51, 0.5, 0.52, 0.5]);
        assert_eq!(pick(&[slow.clone(), fast.clone()], 0.01), Some(1));
        assert!(slow.loses_to(&fast));
    }
}
