//! Reliability: AFR and expected failures from MTTF, and the probability of losing data over
//! the service life from a per-group Markov model with rebuild windows (docs/PLANNER.md
//! derives it and lists its assumptions).
//!
//! One failure unit (a redundancy group, or a mirror set for raid10) has `n` disks and
//! survives `f` failures. State `k` (0 ..= f) counts failed disks whose rebuild has not
//! finished. A disk fails at rate `λ = 1/MTTF`, so state `k` moves up at `(n-k)λ`; each
//! failed disk is rebuilt within its own window `W` (replacement delay + rebuild time), so
//! state `k` moves down at `kμ`, `μ = 1/W` (windows run concurrently; to first order this
//! gives the overlap probability of fixed-length windows, `W^f/f!`). A failure in state `f`
//! loses data. With unrecoverable read errors (URE) enabled, entering state `f` (the last
//! redundancy in use) loses data with probability `q`, the chance that reading the `n - f`
//! survivors end to end hits a URE.
//!
//! The mean time to data loss from state 0 has a closed form with no subtractions, so it
//! is accurate however rare the loss: with `T_j` the mean time to first go from state `j`
//! to `j + 1`,
//!
//! ```text
//! T_0 = 1 / b_0,   T_j = (1 + d_j T_{j-1}) / b_j            (b_j = (n-j)λ, d_j = jμ)
//! τ_f = (1 + d_f T_{f-1}) / (b_f + q d_f)                   (mean time to loss from state f)
//! MTTDL = T_0 + ... + T_{f-1} + (1 - q) τ_f                 (= 1/(nλ) when f = 0)
//! ```

use serde::Serialize;

use crate::units::HOURS_PER_YEAR;

/// The largest MTTDL we report, in hours: beyond it the loss probability is zero in `f64`
/// anyway, and clamping keeps every figure finite (JSON has no infinity).
pub const MTTDL_CAP_HOURS: f64 = 1e300;

/// Annualised failure rate from MTTF: `1 - exp(-8760 h / MTTF)` (2.5 M h gives 0.35%).
pub fn afr_from_mttf(mttf_hours: f64) -> f64 {
    -(-HOURS_PER_YEAR / mttf_hours).exp_m1()
}

/// MTTF in hours from an annualised failure rate (the inverse of [`afr_from_mttf`]).
pub fn mttf_from_afr(afr: f64) -> f64 {
    -HOURS_PER_YEAR / (-afr).ln_1p()
}

/// The chance that reading `bytes` hits at least one unrecoverable read error, at
/// `per_bit` errors per bit read.
pub fn ure_probability(per_bit: f64, bytes: f64) -> f64 {
    -(-per_bit * bytes * 8.0).exp_m1()
}

/// Mean time to data loss, in hours, of one failure unit of `n` disks that survives `f`
/// failures, with per-disk failure rate `lambda` (per hour), rebuild window `window_hours`
/// per failed disk, and probability `q` that a rebuild with no redundancy left hits a URE.
pub fn set_mttdl_hours(n: u32, f: u32, lambda: f64, window_hours: f64, q: f64) -> f64 {
    assert!(f < n, "a set of {n} disks cannot survive {f} failures");
    let mu = 1.0 / window_hours;
    let b = |j: u32| (n - j) as f64 * lambda;
    let d = |j: u32| j as f64 * mu;
    let mut total = 0.0;
    let mut t_prev = 0.0; // T_{j-1}
    for j in 0..f {
        let t = ((1.0 + d(j) * t_prev) / b(j)).min(MTTDL_CAP_HOURS);
        total += t;
        t_prev = t;
    }
    // From state f: a failure loses data; a rebuild finishing returns to f - 1.
    let q = if f == 0 { 0.0 } else { q };
    let tau = ((1.0 + d(f) * t_prev) / (b(f) + q * d(f))).min(MTTDL_CAP_HOURS);
    (total + (1.0 - q) * tau).min(MTTDL_CAP_HOURS)
}

/// The probability that at least one of `sets` independent units, each with mean time to
/// data loss `set_mttdl_hours`, loses data within `hours`.
pub fn p_loss(sets: u32, set_mttdl_hours: f64, hours: f64) -> f64 {
    -(-(sets as f64) * hours / set_mttdl_hours).exp_m1()
}

/// How the rebuild rate was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RateSource {
    /// `--rebuild-rate`.
    Given,
    /// The disk's sequential speed times the rebuild share.
    Disk,
    /// An assumed disk speed times the rebuild share (no disk speed given).
    Assumed,
}

/// The rebuild window of one failed disk.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rebuild {
    /// Rebuild rate onto the replacement, MB/s (10^6 bytes).
    pub rate_mb_s: f64,
    pub rate_source: RateSource,
    /// Time to rebuild one whole disk at that rate (declustered: divided by `speedup`).
    pub rebuild_hours: f64,
    /// How many times faster than onto one replacement (declustered with spare space:
    /// `(N - 1) / (D + 1)`; else 1).
    pub speedup: f64,
    /// Time before a rebuild can start: 0 with hot spares, else the replacement delay.
    pub replacement_hours: f64,
    /// `replacement_hours + rebuild_hours`.
    pub window_hours: f64,
}

/// Reliability figures of a layout over its service life.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reliability {
    pub mttf_hours: f64,
    /// Annualised failure rate of one disk, as a fraction (0.0035 = 0.35%).
    pub afr: f64,
    pub service_years: f64,
    /// Disk failures expected per year across all disks, spares included (failed disks
    /// are replaced, so the population stays constant).
    pub expected_failures_per_year: f64,
    /// Disk failures expected over the service life.
    pub expected_failures: f64,
    pub rebuild: Rebuild,
    /// URE rate per bit read, when the URE option is on.
    pub ure_per_bit: Option<f64>,
    /// Chance that one rebuild with no redundancy left hits a URE, when the option is on.
    pub ure_per_critical_rebuild: Option<f64>,
    /// Mean time to data loss of one failure unit (group or mirror set), hours.
    pub set_mttdl_hours: f64,
    /// Mean time to data loss of the whole array, hours and years.
    pub mttdl_hours: f64,
    pub mttdl_years: f64,
    /// Probability of losing data within one year, and within the service life.
    pub p_loss_per_year: f64,
    pub p_loss: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * a.abs().max(b.abs())
    }

    #[test]
    fn afr_of_the_field_disk() {
        // The field's arithmetic: MTTF 2.5 M hours is an AFR of 0.35%.
        let afr = afr_from_mttf(2.5e6);
        assert_eq!(format!("{:.2}", afr * 100.0), "0.35");
        assert!(close(afr, 0.003_497_9, 1e-4), "{afr}");
        assert!(close(mttf_from_afr(afr), 2.5e6, 1e-12));
        assert!(close(mttf_from_afr(0.0035), 2_498_500.0, 1e-4));
    }

    #[test]
    fn mttdl_closed_forms() {
        let (lambda, w) = (1.0 / 1e6, 50.0);
        let mu = 1.0 / w;
        // No redundancy: the first of n failures.
        assert!(close(
            set_mttdl_hours(12, 0, lambda, w, 0.0),
            1e6 / 12.0,
            1e-12
        ));
        // One parity: the textbook exact Markov result (mu + (2n-1) lambda) / (n (n-1) lambda^2).
        let n = 8.0;
        let want = (mu + (2.0 * n - 1.0) * lambda) / (n * (n - 1.0) * lambda * lambda);
        assert!(close(set_mttdl_hours(8, 1, lambda, w, 0.0), want, 1e-12));
        // Two parity, written out by hand from the recursion...
        let n = 10.0;
        let t0 = 1.0 / (n * lambda);
        let t1 = (1.0 + mu * t0) / ((n - 1.0) * lambda);
        let t2 = (1.0 + 2.0 * mu * t1) / ((n - 2.0) * lambda);
        let exact = set_mttdl_hours(10, 2, lambda, w, 0.0);
        assert!(close(exact, t0 + t1 + t2, 1e-12));
        // ... and close to the first-order MTTF^3 / (n (n-1) (n-2) W^2 / 2).
        let approx = 2.0 / (n * (n - 1.0) * (n - 2.0) * lambda.powi(3) * w * w);
        assert!(close(exact, approx, 1e-3), "{exact} vs {approx}");
    }

    #[test]
    fn ure_on_the_last_redundancy() {
        // Reading 9 x 20 TB at 1e-15 per bit: 1 - exp(-1.44).
        let q = ure_probability(1e-15, 9.0 * 20e12);
        assert!(close(q, 0.763, 1e-3), "{q}");
        let (lambda, w) = (1.0 / 1e6, 50.0);
        // A certain URE turns the first failure into a loss whenever f = 1.
        assert!(close(
            set_mttdl_hours(10, 1, lambda, w, 1.0),
            1e6 / 10.0,
            1e-12
        ));
        // No effect without redundancy; some effect with it.
        assert_eq!(
            set_mttdl_hours(10, 0, lambda, w, 0.5),
            set_mttdl_hours(10, 0, lambda, w, 0.0)
        );
        assert!(set_mttdl_hours(10, 2, lambda, w, 0.5) < set_mttdl_hours(10, 2, lambda, w, 0.0));
    }

    #[test]
    fn the_documented_ure_corner() {
        // docs/PLANNER.md: with one redundancy and q > (n-1)/n, a faster rebuild shortens
        // the MTTDL by less than a rebuild window (less time degraded, where only n-1
        // disks can fail into the next doomed rebuild). Check the corner is what we say.
        let (lambda, q) = (1.0 / 1e6, 0.8);
        let slow = set_mttdl_hours(2, 1, lambda, 100.0, q);
        let fast = set_mttdl_hours(2, 1, lambda, 10.0, q);
        assert!(fast < slow && slow - fast < 100.0, "{slow} {fast}");
        // Below the threshold it is monotone again.
        let q = 0.4;
        assert!(set_mttdl_hours(2, 1, lambda, 10.0, q) > set_mttdl_hours(2, 1, lambda, 100.0, q));
    }

    #[test]
    fn loss_over_a_horizon() {
        assert!(close(p_loss(1, 100.0, 100.0), 1.0 - (-1.0f64).exp(), 1e-12));
        // Independent sets multiply their survival.
        let one = p_loss(1, 1e9, 43_800.0);
        assert!(close(
            p_loss(6, 1e9, 43_800.0),
            1.0 - (1.0 - one).powi(6),
            1e-9
        ));
        // Tiny probabilities keep their precision.
        assert!(close(p_loss(1, 1e20, 1.0), 1e-20, 1e-9));
        // Huge MTTDLs stay finite.
        let m = set_mttdl_hours(250, 120, 1e-7, 1.0, 0.0);
        assert!(m.is_finite() && m == MTTDL_CAP_HOURS);
        assert!(p_loss(1, m, 1e6) < 1e-290);
        let m = set_mttdl_hours(256, 128, 1e-8, 0.001, 0.5);
        assert!(m.is_finite() && m == MTTDL_CAP_HOURS);
    }
}
