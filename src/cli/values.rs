//! Parsers for numeric flags that reject what makes no sense (zero counts, NaN, out-of-range shares) before any
//! work starts: clap then exits 2 naming the flag and the accepted range.

/// A count of at least 1 (chunks, samples, tokens per chunk, requests).
pub fn count(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(value) => Ok(value),
        Err(error) => Err(format!("not a whole number ({error})")),
    }
}

/// Tokens per KV page: 1 to 2^20 (a larger page than any context is a typo, and its pool would not fit in memory).
pub fn page_size(text: &str) -> Result<usize, String> {
    const MAX: usize = 1 << 20;
    let value = count(text)?;
    if value > MAX {
        return Err(format!("must be at most {MAX} tokens"));
    }
    Ok(value)
}

fn finite(text: &str) -> Result<f64, String> {
    let value: f64 = text.parse().map_err(|error| format!("not a number ({error})"))?;
    if !value.is_finite() {
        return Err("must be a finite number".into());
    }
    Ok(value)
}

/// A finite number ≥ 0 (a KLD limit, a temperature).
pub fn non_negative(text: &str) -> Result<f64, String> {
    let value = finite(text)?;
    if value < 0.0 {
        return Err("must be at least 0".into());
    }
    Ok(value)
}

/// A finite number > 0 (an error or ratio limit).
pub fn positive(text: &str) -> Result<f64, String> {
    let value = finite(text)?;
    if value <= 0.0 {
        return Err("must be greater than 0".into());
    }
    Ok(value)
}

/// A percentage in [0, 100].
pub fn percent(text: &str) -> Result<f64, String> {
    let value = finite(text)?;
    if !(0.0..=100.0).contains(&value) {
        return Err("must be between 0 and 100".into());
    }
    Ok(value)
}

/// A probability mass in (0, 1] (nucleus sampling).
pub fn mass(text: &str) -> Result<f32, String> {
    let value = finite(text)?;
    if !(value > 0.0 && value <= 1.0) {
        return Err("must be in (0, 1]".into());
    }
    Ok(value as f32)
}

/// A temperature: finite, ≥ 0 (0 is greedy).
pub fn temperature(text: &str) -> Result<f32, String> {
    Ok(non_negative(text)? as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_zero_nan_and_out_of_range() {
        assert!(count("0").is_err() && count("-1").is_err() && count("3") == Ok(3));
        assert!(page_size("100000000").is_err() && page_size("16") == Ok(16));
        for bad in ["nan", "inf", "-0.5"] {
            assert!(non_negative(bad).is_err(), "{bad}");
            assert!(temperature(bad).is_err(), "{bad}");
        }
        assert!(positive("0").is_err() && positive("nan").is_err() && positive("1.05") == Ok(1.05));
        assert!(percent("101").is_err() && percent("nan").is_err() && percent("90") == Ok(90.0));
        for bad in ["0", "1.5", "nan", "-1"] {
            assert!(mass(bad).is_err(), "{bad}");
        }
        assert_eq!(mass("1"), Ok(1.0));
    }
}
