//! How far an output is from its reference: relative L2 error and largest absolute difference (f64 sums), the one
//! measure the op checks, the self-test and the device tests compare with.

/// The errors of `got` against `want`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Errors {
    /// ‖got − want‖₂ / ‖want‖₂ (the norm floored at 1e-30); infinite when `got` holds a non-finite value or the
    /// lengths differ.
    pub rel_l2: f64,
    /// max |got − want| over the finite pairs.
    pub max_abs: f64,
    /// Elements of `got` that are NaN or infinite.
    pub non_finite: usize,
}

/// Compares `got` with `want` element by element.
pub fn errors(got: &[f32], want: &[f32]) -> Errors {
    let (mut diff, mut norm, mut max_abs, mut non_finite) = (0f64, 0f64, 0f64, 0);
    for (&g, &w) in got.iter().zip(want) {
        if !g.is_finite() {
            non_finite += 1;
            continue;
        }
        let d = (g as f64 - w as f64).abs();
        diff += d * d;
        norm += (w as f64) * (w as f64);
        max_abs = max_abs.max(d);
    }
    let rel_l2 =
        if got.len() != want.len() || non_finite > 0 { f64::INFINITY } else { (diff / norm.max(1e-30)).sqrt() };
    Errors { rel_l2, max_abs, non_finite }
}

/// Relative L2 error of `got` against `want` (see [`Errors::rel_l2`]).
pub fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    errors(got, want).rel_l2
}

/// Elements whose bits differ (NaN equal to NaN).
pub fn bit_mismatches(got: &[f32], want: &[f32]) -> usize {
    let differing = got.iter().zip(want).filter(|(g, w)| g.to_bits() != w.to_bits() && !(g.is_nan() && w.is_nan()));
    differing.count() + got.len().abs_diff(want.len())
}

/// The index of the largest value, the first on ties (as `std::max_element`): a greedy token, and what same-top
/// compares.
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (index, &value) in row.iter().enumerate() {
        if value > row[best] {
            best = index;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_measure_relative_l2_and_max_abs() {
        let e = errors(&[1.0, 2.0, 2.0], &[1.0, 2.0, 3.0]);
        assert!((e.rel_l2 - (1.0f64 / 14.0).sqrt()).abs() < 1e-12);
        assert_eq!((e.max_abs, e.non_finite), (1.0, 0));
        assert_eq!(errors(&[f32::NAN], &[1.0]).rel_l2, f64::INFINITY);
        assert_eq!(errors(&[1.0], &[1.0, 2.0]).rel_l2, f64::INFINITY);
        assert_eq!(bit_mismatches(&[f32::NAN, 1.0, 0.0], &[f32::NAN, 1.0, -0.0]), 1);
    }
}
