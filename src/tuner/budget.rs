//! The tune's `--budget` as a plan: one clock from the command's start (the
//! model's load included), each stage's end taken as a share of what is left when
//! it begins ([`Budget::share`]), each stage's measured time, and what a stage cut
//! to fit (fewer races, combinations, tokens, accuracy scores or head-to-head
//! rounds), for the report ([`BudgetReport`]). The stages size themselves from
//! their own first measurements ([`Budget::fit`]).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

/// The share of what is left after the survey that the slot races may use in
/// full; past it a race measures its first candidate alone.
pub const RACES_SHARE: f64 = 0.55;
/// The share of what is left after the survey past which no race starts (the
/// rest: the end-to-end stage's minimum).
pub const RACES_LIMIT: f64 = 0.7;

/// A set of races' place in its stage's budget ([`super::race::run_all`]):
/// what the budget's notes call them, the share of what is left that they
/// may use in full and the share past which none starts.
pub struct RaceShares {
    pub name: &'static str,
    pub full: f64,
    pub limit: f64,
}

/// The slot races' shares.
pub const SLOT_RACES: RaceShares = RaceShares { name: "slot races", full: RACES_SHARE, limit: RACES_LIMIT };

/// The share of what is left after the races that the end-to-end timing may use
/// (the rest: the accuracy check and the head-to-head confirmation).
pub const TIMING_SHARE: f64 = 0.6;
/// The share of what is left after the timing that the accuracy check may use.
pub const ACCURACY_SHARE: f64 = 0.6;
/// With `--serve-batches`: the share of what is left after the survey kept for
/// the decode batch regimes (the stages before them end that much earlier).
pub const BATCHES_SHARE: f64 = 0.3;
/// Of the decode batch regimes' time: the share kept from their races for
/// their end-to-end check (an engine built over the paged cache, then its
/// rounds): on lavapipe on a 2-core EPYC 7001 the races took the whole of a
/// 20 s tune's reserve and no size was timed end to end.
pub const BATCH_CHECK_SHARE: f64 = 0.5;

/// One stage's wall time.
#[derive(Clone, Debug, Serialize)]
pub struct StageTime {
    pub stage: String,
    pub seconds: f64,
}

/// How a tune spent its budget: the budget, the time used from the command's
/// start, each stage's time (in order; they add up to about `used_s`), and what
/// was cut to fit, one sentence each.
#[derive(Clone, Debug, Default, Serialize)]
pub struct BudgetReport {
    pub budget_s: f64,
    pub used_s: f64,
    pub stages: Vec<StageTime>,
    pub cuts: Vec<String>,
}

/// The budget of one tune (see the module doc).
pub struct Budget {
    start: Instant,
    total: Duration,
    /// Kept for a later stage ([`Budget::reserve`]): the earlier ones end before it.
    reserved: Mutex<Duration>,
    log: Mutex<BudgetReport>,
}

impl Budget {
    /// A budget of `total` counted from `start` (the command's start); what
    /// happened before now is recorded as the stage `before`.
    pub fn new(start: Instant, total: Duration, before: &str) -> Budget {
        let log = Mutex::new(BudgetReport { budget_s: total.as_secs_f64(), ..Default::default() });
        let b = Budget { start, total, reserved: Mutex::new(Duration::ZERO), log };
        b.record(before, start);
        let fixed = start.elapsed();
        if fixed >= total {
            b.cut(format!(
                "{before} took {:.1} s, past the {:.1} s budget before any race: every stage runs its minimum \
                 (a larger --budget, fewer --layers or a smaller model leaves time to search)",
                fixed.as_secs_f64(),
                total.as_secs_f64()
            ));
        }
        b
    }

    /// When the budget ends (for the stages before a reserve, that much earlier).
    pub fn deadline(&self) -> Instant {
        self.start + self.total.saturating_sub(*self.reserved.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Keeps `frac` of what is left now for a later stage: the stages until
    /// [`Budget::release`] end before it.
    pub fn reserve(&self, frac: f64) {
        let left = (self.start + self.total).saturating_duration_since(Instant::now());
        *self.reserved.lock().unwrap_or_else(|p| p.into_inner()) = left.mul_f64(frac);
    }

    /// Hands the reserve to the stages from now on.
    pub fn release(&self) {
        *self.reserved.lock().unwrap_or_else(|p| p.into_inner()) = Duration::ZERO;
    }

    /// The end of a stage that may use `frac` of what is left now.
    pub fn share(&self, frac: f64) -> Instant {
        let now = Instant::now();
        now + self.deadline().saturating_duration_since(now).mul_f64(frac)
    }

    /// Runs stage `name`, recording its time.
    pub fn stage<R>(&self, name: &str, f: impl FnOnce() -> R) -> R {
        let t0 = Instant::now();
        let out = f();
        self.record(name, t0);
        out
    }

    /// Records stage `name` as having run from `since` until now.
    pub fn record(&self, name: &str, since: Instant) {
        let seconds = since.elapsed().as_secs_f64();
        self.lock().stages.push(StageTime { stage: name.to_string(), seconds });
    }

    /// Records what a stage cut to fit the budget.
    pub fn cut(&self, what: String) {
        self.lock().cuts.push(what);
    }

    /// The report so far, `used_s` from the start until now.
    pub fn report(&self) -> BudgetReport {
        let mut r = self.lock().clone();
        r.used_s = self.start.elapsed().as_secs_f64();
        r
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BudgetReport> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Seconds from now until `end` (0 when past).
    pub fn until(end: Instant) -> f64 {
        end.saturating_duration_since(Instant::now()).as_secs_f64()
    }

    /// How many of `n` units of `unit_s` seconds each fit in `left_s` seconds, at
    /// least `min` (and at most `n`).
    pub fn fit(left_s: f64, unit_s: f64, n: usize, min: usize) -> usize {
        let fits = if unit_s > 0.0 { (left_s.max(0.0) / unit_s).floor().min(n as f64) as usize } else { n };
        fits.max(min).min(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_fits_and_a_fixed_cost_past_the_budget_are_reported() {
        let start = Instant::now();
        let b = Budget::new(start, Duration::from_secs(100), "loading the model");
        assert!(b.report().cuts.is_empty());
        let half = b.share(0.5);
        let s = half.saturating_duration_since(start).as_secs_f64();
        assert!((49.0..=51.0).contains(&s), "{s}");
        assert_eq!(Budget::fit(10.0, 3.0, 12, 2), 3);
        assert_eq!(Budget::fit(10.0, 30.0, 12, 2), 2, "the minimum");
        assert_eq!(Budget::fit(10.0, 0.1, 12, 2), 12, "at most n");
        assert_eq!(Budget::fit(-5.0, 1.0, 4, 0), 0, "past the end");
        assert!(Budget::until(Instant::now() + Duration::from_secs(10)) > 9.0);
        b.stage("one", || ());
        let r = b.report();
        assert_eq!(r.stages.iter().map(|s| s.stage.as_str()).collect::<Vec<_>>(), ["loading the model", "one"]);
        assert_eq!(r.budget_s, 100.0);

        let late = Budget::new(start, Duration::ZERO, "loading the model");
        assert!(late.report().cuts[0].contains("past the 0.0 s budget before any race"), "{:?}", late.report().cuts);
    }
}
