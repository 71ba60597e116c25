//! The statistics of a few rounds of `scale`: a figure's median and spread
//! over the rounds ([`Spread`]), and a topology's figure against direct's
//! round by round ([`Paired`]).
//!
//! Quantiles interpolate linearly between order statistics (Hyndman and
//! Fan's type 7, R's and NumPy's default): the `q` quantile of `n` sorted
//! values is at position `(n − 1)·q`, so the median of an even number is
//! the mean of the middle two, and of `[1, 2, 3, 4]` the quartiles are
//! 1.75 and 3.25.
//!
//! Whether a topology differs from direct by more than the run-to-run
//! spread is decided by the exact two-sided **sign test** on the paired
//! differences (each round's figure minus direct's of the same round, ties
//! left out): if the topology made no difference, each round's difference
//! would be as likely above zero as below (the rounds are independent, on
//! fresh control planes, and their order rotates, so a slow hour or a
//! warm cache falls on each topology alike), and the number above follows
//! Binomial(n, ½). The difference is called beyond the spread when
//! `p ≤` [`ALPHA`]: with 5 rounds, all 5 on one side (p = 2/2⁵ = 0.0625);
//! with 8, at least 7 of 8; with fewer than 5, never. It asks nothing of
//! the figures' distribution, and pairing takes out what a round shares
//! (the machine's load then); it says nothing of the difference's size,
//! which is the median paired ratio.

/// The sign test's level: a difference is beyond the run-to-run spread at
/// `p ≤ ALPHA`.
pub const ALPHA: f64 = 0.10;

/// The `q` quantile (`0 ≤ q ≤ 1`) of `sorted` (ascending), by linear
/// interpolation between order statistics (type 7); `None` when empty.
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let h = last as f64 * q.clamp(0.0, 1.0);
    let (i, frac) = (h.floor() as usize, h - h.floor());
    let lo = sorted[i];
    Some(match sorted.get(i + 1) {
        Some(hi) if frac > 0.0 => lo + frac * (hi - lo),
        _ => lo,
    })
}

fn sorted(values: &[f64]) -> Vec<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    v.sort_by(f64::total_cmp);
    v
}

/// A figure over the rounds: its median, its range, and its quartiles
/// where there are at least 4 values (below that they say nothing the
/// range does not).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub n: usize,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// The first and third quartiles, with 4 values or more.
    pub iqr: Option<(f64, f64)>,
}

impl Spread {
    /// Of `values` (NaN left out); `None` when there are none.
    pub fn of(values: &[f64]) -> Option<Spread> {
        let v = sorted(values);
        let iqr = if v.len() >= 4 {
            Some((quantile(&v, 0.25)?, quantile(&v, 0.75)?))
        } else {
            None
        };
        Some(Spread {
            n: v.len(),
            median: quantile(&v, 0.5)?,
            min: *v.first()?,
            max: *v.last()?,
            iqr,
        })
    }

    /// As "0.41 [0.38–0.52; IQR 0.40–0.45] n=5", with `decimals`.
    pub fn show(&self, decimals: usize) -> String {
        let d = decimals;
        let iqr = self
            .iqr
            .map(|(a, b)| format!("; IQR {a:.d$}–{b:.d$}"))
            .unwrap_or_default();
        format!(
            "{:.d$} [{:.d$}–{:.d$}{iqr}] n={}",
            self.median, self.min, self.max, self.n
        )
    }
}

/// A topology's figure against direct's, round by round.
#[derive(Debug, Clone, PartialEq)]
pub struct Paired {
    /// Rounds with both figures.
    pub rounds: usize,
    /// Rounds where the topology's figure was above direct's, and below
    /// (the others tie).
    pub higher: usize,
    pub lower: usize,
    /// The topology's figure ÷ direct's, over the rounds where direct's
    /// is above zero.
    pub ratio: Option<Spread>,
    /// The exact two-sided sign test's p of `higher` against `lower`.
    pub p: f64,
}

impl Paired {
    /// Of `(topology's, direct's)` figure per round.
    pub fn of(pairs: &[(f64, f64)]) -> Paired {
        let higher = pairs.iter().filter(|(t, d)| t > d).count();
        let lower = pairs.iter().filter(|(t, d)| t < d).count();
        let ratios: Vec<f64> = pairs
            .iter()
            .filter(|(_, d)| *d > 0.0)
            .map(|(t, d)| t / d)
            .collect();
        Paired {
            rounds: pairs.len(),
            higher,
            lower,
            ratio: Spread::of(&ratios),
            p: sign_test(higher, lower),
        }
    }

    /// Whether the difference is beyond the run-to-run spread: the sign
    /// test's `p ≤` [`ALPHA`].
    pub fn beyond_spread(&self) -> bool {
        self.p <= ALPHA
    }

    /// As "1.08× [0.95–1.31×]; higher in 4 of 5 rounds, lower in 1; sign
    /// test p = 0.3750: within the spread".
    pub fn show(&self) -> String {
        let ratio = match &self.ratio {
            Some(r) => format!("{:.2}× [{:.2}–{:.2}×]", r.median, r.min, r.max),
            None => "ratio —".into(),
        };
        let verdict = if self.beyond_spread() {
            if self.higher > self.lower {
                "higher, beyond the spread"
            } else {
                "lower, beyond the spread"
            }
        } else {
            "within the spread"
        };
        format!(
            "{ratio}; higher in {} of {} rounds, lower in {}; sign test p = {:.4}: {verdict}",
            self.higher, self.rounds, self.lower, self.p
        )
    }
}

/// The exact two-sided sign test: the probability, were each of
/// `higher + lower` differences as likely positive as negative, of a split
/// at least as uneven as this one; 1 with no differences.
pub fn sign_test(higher: usize, lower: usize) -> f64 {
    let n = higher + lower;
    let k = higher.min(lower);
    // P(X ≤ k) for X ~ Binomial(n, ½), by the binomial coefficients.
    let mut c = 1.0_f64;
    let mut tail = 0.0;
    for i in 0..=k {
        if i > 0 {
            c = c * (n + 1 - i) as f64 / i as f64;
        }
        tail += c;
    }
    (2.0 * tail / 2f64.powi(n as i32)).min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_between_order_statistics() {
        let median = |v: &[f64]| Spread::of(v).map(|s| s.median);
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 2.0]), Some(2.0));
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&v, 0.25), Some(1.75));
        assert_eq!(quantile(&v, 0.75), Some(3.25));
        assert_eq!(
            (quantile(&v, 0.0), quantile(&v, 1.0)),
            (Some(1.0), Some(4.0))
        );
        let v = [10.0, 20.0, 30.0, 40.0, 50.0];
        assert_eq!(quantile(&v, 0.25), Some(20.0));
        assert_eq!(quantile(&v, 0.75), Some(40.0));
    }

    #[test]
    fn a_spread_has_quartiles_from_four_values_on() {
        let s = Spread::of(&[5.0, 1.0, 3.0]).unwrap();
        assert_eq!(
            (s.n, s.median, s.min, s.max, s.iqr),
            (3, 3.0, 1.0, 5.0, None)
        );
        assert_eq!(s.show(1), "3.0 [1.0–5.0] n=3");
        let s = Spread::of(&[4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!(s.iqr, Some((1.75, 3.25)));
        assert_eq!(s.show(2), "2.50 [1.00–4.00; IQR 1.75–3.25] n=4");
        assert_eq!(Spread::of(&[]), None);
    }

    #[test]
    fn the_sign_test_is_exact_and_two_sided() {
        assert_eq!(sign_test(0, 0), 1.0);
        assert_eq!(sign_test(4, 0), 0.125);
        assert_eq!(sign_test(5, 0), 0.0625);
        assert_eq!(sign_test(0, 5), 0.0625);
        assert_eq!(sign_test(4, 1), 0.375);
        assert_eq!(sign_test(3, 3), 1.0);
        // 7 of 8: 2 · (1 + 8) / 256.
        assert_eq!(sign_test(7, 1), 18.0 / 256.0);
    }

    #[test]
    fn a_difference_is_beyond_the_spread_only_when_the_rounds_agree() {
        // Five rounds, every one above direct: beyond (p = 0.0625).
        let p = Paired::of(&[(2.0, 1.0), (2.2, 2.0), (1.1, 1.0), (3.0, 1.5), (1.3, 1.2)]);
        assert_eq!((p.rounds, p.higher, p.lower), (5, 5, 0));
        assert!(p.beyond_spread());
        assert_eq!(p.ratio.unwrap().median, 1.1);
        assert!(
            p.show().ends_with("p = 0.0625: higher, beyond the spread"),
            "{}",
            p.show()
        );
        // Four rounds, all above: too few to tell (p = 0.125).
        assert!(!Paired::of(&[(2.0, 1.0); 4]).beyond_spread());
        // One of five below: within, however large the median ratio.
        let p = Paired::of(&[(9.0, 1.0), (9.0, 1.0), (9.0, 1.0), (9.0, 1.0), (0.5, 1.0)]);
        assert!(!p.beyond_spread());
        assert_eq!(p.ratio.unwrap().median, 9.0);
        // Ties leave the test: 5 below and a tie is still beyond.
        let mut pairs = vec![(1.0, 2.0); 5];
        pairs.push((2.0, 2.0));
        let p = Paired::of(&pairs);
        assert_eq!((p.rounds, p.higher, p.lower), (6, 0, 5));
        assert!(p.beyond_spread());
        assert!(p.show().ends_with("lower, beyond the spread"));
        // Direct at zero: no ratio, the signs still count.
        assert_eq!(Paired::of(&[(1.0, 0.0)]).ratio, None);
    }
}
