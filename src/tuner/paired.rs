//! The paired rule the end-to-end stage decides by: a combination's request
//! times against the runtime default's, round by round (a machine-wide slowdown
//! during one round cancels), how many rounds it won and its median ratio; when
//! that counts as beating the default, when more rounds could still settle it,
//! and the reason of a decision in words.

use crate::stats::summarize;

/// A relative gain a combination must show over the runtime's default, as the
/// median of their per-round ratios, to be chosen instead of it (a profile is only
/// worth its differences, and on a shared or throttling machine a run of lucky
/// rounds is worth less than that).
pub const DEFAULT_MARGIN: f64 = 0.02;

/// The odds under which a combination's wins over the default must be to
/// count as a gain when it lost a round: those of winning all of five rounds by
/// chance (a sign test). A combination faster in every round (two at least)
/// counts as before; one noisy round among nine or more does not disqualify it.
const PAIRED_ODDS: f64 = 1.0 / 32.0;

/// One combination's rounds against the default's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Paired {
    /// Rounds both were timed in.
    pub rounds: usize,
    /// Rounds it was faster in.
    pub wins: usize,
    /// The median of its per-round ratios to the default (below 1: faster).
    pub ratio: f64,
}

/// The odds of at least `k` wins in `n` rounds of a coin toss.
fn tail(n: usize, k: usize) -> f64 {
    let mut c = 1.0f64;
    let mut sum = 0.0;
    for i in 0..=n {
        if i >= k {
            sum += c;
        }
        c = c * (n - i) as f64 / (i + 1) as f64;
    }
    sum / 2f64.powi(n as i32)
}

impl Paired {
    /// `times` against `default`, round by round (the rounds both have).
    pub fn of(times: &[f64], default: &[f64]) -> Paired {
        let r: Vec<f64> = times.iter().zip(default).map(|(a, b)| a / b).collect();
        let ratio = if r.is_empty() { f64::INFINITY } else { summarize(&r).median };
        Paired { rounds: r.len(), wins: r.iter().filter(|&&x| x < 1.0).count(), ratio }
    }

    /// Its median gain over the default, percent.
    pub fn gain_pct(&self) -> f64 {
        (1.0 - self.ratio) * 100.0
    }

    /// Whether it beats the default: two rounds at least, faster in every one
    /// or in so many that chance gives odds under [`PAIRED_ODDS`], and a median
    /// gain of [`DEFAULT_MARGIN`].
    pub fn beats(&self) -> bool {
        self.rounds >= 2 && (self.wins == self.rounds || tail(self.rounds, self.wins) <= PAIRED_ODDS) && self.ratio < 1.0 - DEFAULT_MARGIN
    }

    /// Whether more rounds, up to `max` in all, could still make it beat the
    /// default: its median gain is past the margin but its wins are not yet
    /// enough, and winning every round left would make them enough.
    pub fn open(&self, max: usize) -> bool {
        !self.beats() && self.ratio < 1.0 - DEFAULT_MARGIN && max > self.rounds && tail(max, self.wins + max - self.rounds) <= PAIRED_ODDS
    }

    /// Why it does not beat the default (for a reason in words).
    pub fn why_not(&self) -> String {
        if self.rounds < 2 {
            format!("{} round(s) timed, two are needed", self.rounds)
        } else if self.ratio >= 1.0 - DEFAULT_MARGIN {
            format!("a median gain of {:.1}% is under the {:.0}% margin", self.gain_pct(), DEFAULT_MARGIN * 100.0)
        } else {
            format!(
                "faster by {:.1}% (median) but in {} of {} rounds only, which chance gives with odds of 1 in {:.0}; the rule wants under 1 in {:.0}",
                self.gain_pct(),
                self.wins,
                self.rounds,
                1.0 / tail(self.rounds, self.wins),
                1.0 / PAIRED_ODDS
            )
        }
    }

    /// How it beat the default (for a reason in words).
    pub fn how(&self) -> String {
        format!("faster in {} of {} rounds, by {:.1}% (median of the per-round ratios)", self.wins, self.rounds, self.gain_pct())
    }
}

/// The paired rule as a verdict a profile records asks it: the rule on the
/// rounds ([`Paired::beats`]) and the medians the record shows of the same
/// two series (each series' after its outliers are dropped, [`summarize`]),
/// which must agree: in a noisy run the paired ratios can favour what the
/// medians do not (every round won, 0.4167 against 0.4116 ms, was seen).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Recorded {
    pub paired: Paired,
    /// The two series' medians, ms.
    pub tuned_ms: f64,
    pub default_ms: f64,
}

impl Recorded {
    /// `times` against `default`, round by round, and their medians.
    pub fn of(times: &[f64], default: &[f64]) -> Recorded {
        let ms = |x: &[f64]| summarize(x).median * 1e3;
        Recorded { paired: Paired::of(times, default), tuned_ms: ms(times), default_ms: ms(default) }
    }

    /// Whether it beats the default by the rule and by the medians.
    pub fn beats(&self) -> bool {
        self.paired.beats() && self.tuned_ms < self.default_ms
    }

    /// Why it does not beat the default, `median` naming the median of its
    /// series ("its median request").
    pub fn why_not(&self, median: &str) -> String {
        if self.paired.beats() { format!("{}, but {median} is not faster", self.paired.how()) } else { self.paired.why_not() }
    }
}

/// The combination to keep when every round timed each one once (interleaved),
/// by each one's rounds against the default (index 0; an empty list: out of the
/// choice): the lowest median ratio among those that beat it ([`Paired::beats`]),
/// else the default; with each other's comparison. None when the default has no
/// samples (the caller then compares medians).
pub fn pick(times: &[Vec<f64>]) -> Option<(usize, Vec<Option<Paired>>)> {
    let base = times.first().filter(|s| !s.is_empty())?;
    let paired: Vec<Option<Paired>> =
        times.iter().enumerate().map(|(i, s)| (i > 0 && !s.is_empty()).then(|| Paired::of(s, base))).collect();
    let best =
        paired.iter().enumerate().filter_map(|(i, p)| p.filter(Paired::beats).map(|p| (i, p.ratio))).min_by(|a, b| a.1.total_cmp(&b.1));
    Some((best.map_or(0, |(i, _)| i), paired))
}

/// Why the default stays when no combination beat it (`paired`, from [`pick`];
/// `labels` the combinations'): the closest one and why it fell short.
pub fn default_stays(paired: &[Option<Paired>], labels: &[String]) -> String {
    let closest = paired.iter().enumerate().filter_map(|(i, p)| p.map(|p| (i, p))).min_by(|a, b| a.1.ratio.total_cmp(&b.1.ratio));
    match closest {
        None => "the runtime default was the only combination timed and within the accuracy budget: it stays".into(),
        Some((i, p)) => format!(
            "no combination beat the runtime default by the paired rule (faster in every round, or in so many that chance is \
             unlikely, and by {:.0}% in the median): the closest, `{}`, was {}: the default stays",
            DEFAULT_MARGIN * 100.0,
            labels[i],
            p.why_not()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rounds whose speed swings by ±25% together for every combination: a
    /// combination 10% faster in every round wins, one that merely had its fast
    /// rounds where the default had slow ones does not, nor one slower in a round,
    /// and a gain under the margin leaves the default.
    #[test]
    fn paired_ratios_pick_a_steady_gain_and_keep_the_default_otherwise() {
        let best = |t: &[Vec<f64>]| pick(t).map(|(b, _)| b);
        let machine = [1.0, 1.25, 0.8, 1.2, 0.75];
        let default: Vec<f64> = machine.to_vec();
        let steady: Vec<f64> = machine.iter().map(|m| 0.9 * m).collect();
        // Lower median than the default's (0.95 < 1.0), but in each round as slow or slower.
        let lucky = vec![1.0, 1.3, 0.95, 1.2, 0.8];
        assert_eq!(best(&[default.clone(), lucky.clone(), steady.clone()]), Some(2));
        assert_eq!(best(&[default.clone(), lucky.clone()]), Some(0), "no steady gain: the default stays");
        let slight: Vec<f64> = machine.iter().map(|m| 0.99 * m).collect();
        assert_eq!(best(&[default.clone(), slight]), Some(0), "1% is within the margin");
        // Faster by 10% in four rounds, slower in one: not a steady gain.
        let mostly: Vec<f64> = machine.iter().enumerate().map(|(i, m)| if i == 2 { 1.05 * m } else { 0.9 * m }).collect();
        assert_eq!(best(&[default.clone(), mostly.clone()]), Some(0), "one round against it");
        // A combination stopped after three rounds is compared over those rounds.
        assert_eq!(best(&[default.clone(), steady[..3].to_vec()]), Some(1));
        assert_eq!(best(&[Vec::new(), vec![1.0]]), None, "no default samples: medians decide");
        // An empty list is out of the choice.
        assert_eq!(best(&[default, Vec::new(), steady]), Some(2));
    }

    /// One noisy round among many does not disqualify a steady gain: faster in
    /// 9 of 10 rounds beats the default; the same in 4 of 5 leaves the rounds
    /// open (more rounds could settle it), and 7 of 10 does not beat it.
    #[test]
    fn one_noisy_round_among_many_is_a_sign_test_not_a_veto() {
        let rounds = |n: usize, lost: &[usize]| -> (Vec<f64>, Vec<f64>) {
            let default: Vec<f64> = (0..n).map(|i| 1.0 + 0.2 * (i % 3) as f64).collect();
            let tuned = default.iter().enumerate().map(|(i, d)| if lost.contains(&i) { 1.1 * d } else { 0.6 * d }).collect();
            (tuned, default)
        };
        let (t, d) = rounds(10, &[4]);
        let p = Paired::of(&t, &d);
        assert_eq!((p.rounds, p.wins), (10, 9));
        assert!(p.beats(), "{p:?}");
        let (t, d) = rounds(5, &[2]);
        let p = Paired::of(&t, &d);
        assert!(!p.beats() && p.open(12), "{p:?}");
        assert!(p.why_not().contains("4 of 5 rounds"), "{}", p.why_not());
        assert!(!p.open(5), "no rounds left");
        let (t, d) = rounds(10, &[1, 4, 7]);
        assert!(!Paired::of(&t, &d).beats());
        // Within the margin: never open, however many rounds.
        let p = Paired::of(&[0.99, 0.99, 0.99], &[1.0, 1.0, 1.0]);
        assert!(!p.beats() && !p.open(12));
        assert!((tail(5, 5) - 1.0 / 32.0).abs() < 1e-12 && (tail(4, 0) - 1.0).abs() < 1e-12);
    }

    /// The reason the default stays names the closest combination and what it lacked.
    #[test]
    fn the_default_stays_with_the_closest_combination_named() {
        let labels = ["runtime default".to_string(), "a".into(), "b".into()];
        let (best, paired) = pick(&[vec![1.0, 1.0, 1.0], vec![0.9, 1.1, 0.9], vec![0.99, 0.99, 0.99]]).expect("default timed");
        assert_eq!(best, 0);
        let why = default_stays(&paired, &labels);
        assert!(why.contains("the closest, `a`") && why.contains("2 of 3 rounds"), "{why}");
        assert!(default_stays(&[None], &labels[..1]).contains("only combination"));
    }
}
