//! Parsers for numeric flags that reject what makes no sense (zero counts, NaN, out-of-range shares) before any
//! work starts: clap then exits 2 naming the flag and the accepted range. Also the one parser of arguments naming
//! an existing model: a folder, or a Hugging Face repo id found in the local cache.

use std::path::{Path, PathBuf};

use crate::io::hub::{self, HubError};

/// A count of at least 1 (chunks, samples, tokens per chunk, requests).
pub fn count(text: &str) -> Result<usize, String> {
    integer(text, 1)
}

/// A whole number of at least `min` (`--ctx`: 2, the fewest tokens a chunk can be scored on).
pub fn at_least(min: usize) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync + 'static {
    move |text| integer(text, min)
}

/// A whole number, 0 included (seeds, list lengths).
pub fn whole<T: TryFrom<i128>>(text: &str) -> Result<T, String> {
    integer(text, 0)
}

/// A whole number ≥ `min` that fits `T`; a negative or too small one is named with the bound ("must be at least
/// 1, got -1"), as is one too large for `T`.
fn integer<T: TryFrom<i128>>(text: &str, min: usize) -> Result<T, String> {
    let value: i128 = text.trim().parse().map_err(|_| format!("must be a whole number, got `{text}`"))?;
    if value < min as i128 {
        return Err(format!("must be at least {min}, got {value}"));
    }
    T::try_from(value).map_err(|_| format!("{value} is too large"))
}

/// Tokens per KV page: 1 to 2^20 (a larger page than any context is a typo, and its pool would not fit in memory).
pub fn page_size(text: &str) -> Result<usize, String> {
    const MAX: usize = 1 << 20;
    let value = count(text)?;
    if value > MAX {
        return Err(format!("must be at most {MAX} tokens, got {value}"));
    }
    Ok(value)
}

/// A finite number (a range checked where it is used, e.g. `--mem-fraction` by the report's layout).
pub fn finite(text: &str) -> Result<f64, String> {
    let value: f64 = text.trim().parse().map_err(|_| format!("must be a number, got `{text}`"))?;
    if !value.is_finite() {
        return Err(format!("must be a finite number, got {text}"));
    }
    Ok(value)
}

/// A finite number ≥ 0 (a KLD limit, a temperature).
pub fn non_negative(text: &str) -> Result<f64, String> {
    let value = finite(text)?;
    if value < 0.0 {
        return Err(format!("must be at least 0, got {value}"));
    }
    Ok(value)
}

/// A finite number > 0 (an error or ratio limit).
pub fn positive(text: &str) -> Result<f64, String> {
    let value = finite(text)?;
    if value <= 0.0 {
        return Err(format!("must be greater than 0, got {value}"));
    }
    Ok(value)
}

/// A percentage in [0, 100].
pub fn percent(text: &str) -> Result<f64, String> {
    let value = finite(text)?;
    if !(0.0..=100.0).contains(&value) {
        return Err(format!("must be between 0 and 100, got {value}"));
    }
    Ok(value)
}

/// A probability mass in (0, 1] (nucleus sampling).
pub fn mass(text: &str) -> Result<f32, String> {
    let value = finite(text)?;
    if !(value > 0.0 && value <= 1.0) {
        return Err(format!("must be in (0, 1], got {value}"));
    }
    Ok(value as f32)
}

/// A temperature: finite, ≥ 0 (0 is greedy).
pub fn temperature(text: &str) -> Result<f32, String> {
    Ok(non_negative(text)? as f32)
}

/// A model folder, or a Hugging Face repo id (`ORG/NAME[@REV]`) resolved to its snapshot folder in the local cache
/// (never downloaded). An existing path wins. A text that is neither goes on as a path, for the command's own "not
/// a model folder" error, unless it looks like a mistyped repo id: then it is refused saying why it is not one.
pub fn model_dir(text: &str) -> Result<PathBuf, String> {
    let path = Path::new(text);
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    match hub::resolve(text) {
        Ok(snapshot) => Ok(snapshot),
        Err(HubError::NotRepoId { reason, .. }) if looks_like_repo_id(text) => {
            Err(format!("no file or folder `{text}` here, and it is not a Hugging Face repo id either: {reason}"))
        }
        Err(HubError::NotRepoId { .. }) => Ok(path.to_path_buf()),
        Err(error @ (HubError::NotCached { .. } | HubError::NoCache)) => {
            Err(format!("no file or folder `{text}` here, and {error}"))
        }
        Err(error) => Err(error.to_string()),
    }
}

/// `squeeze report`'s MODEL: an existing path, then a preset name (presets have no `/`), then a repo id.
pub fn report_model(text: &str) -> Result<String, String> {
    if Path::new(text).exists() || crate::model::presets::config_text(text).is_some() {
        return Ok(text.into());
    }
    model_dir(text)?.into_os_string().into_string().map_err(|path| {
        format!(
            "the snapshot folder of `{text}`, {}, is not valid UTF-8; pass a copy or link of it under a UTF-8 path",
            Path::new(&path).display()
        )
    })
}

/// Whether a text that is no repo id was probably meant as one (two non-empty names around one `/`, not `./…` or
/// `~/…`), so that saying why it is not one helps.
fn looks_like_repo_id(text: &str) -> bool {
    let id = text.split_once('@').map_or(text, |(id, _)| id);
    match id.split_once('/') {
        Some((org, name)) => !org.is_empty() && !name.is_empty() && !name.contains('/') && !org.starts_with(['.', '~']),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_zero_nan_and_out_of_range() {
        assert!(count("0").is_err() && count("3") == Ok(3));
        assert_eq!(count("-1"), Err("must be at least 1, got -1".into()));
        assert_eq!(at_least(2)("1"), Err("must be at least 2, got 1".into()));
        assert_eq!(whole::<u64>("-3"), Err("must be at least 0, got -3".into()));
        assert_eq!(whole::<u64>("0"), Ok(0));
        assert!(whole::<u8>("300").unwrap_err().contains("too large"));
        assert!(count("x").unwrap_err().contains("whole number"));
        assert_eq!(percent("-5"), Err("must be between 0 and 100, got -5".into()));
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

    #[test]
    fn an_existing_path_wins_and_only_near_repo_ids_are_explained() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().to_str().unwrap();
        assert_eq!(model_dir(text), Ok(dir.path().to_path_buf()));
        assert_eq!(report_model(text), Ok(text.to_string()));
        assert_eq!(report_model("kimi-k2"), Ok("kimi-k2".to_string()));
        // Not repo ids, not there: passed on for the command's own error.
        for path in ["missing-folder", "./org/name", "out/int4/model", "/no/such/dir", "out/"] {
            assert_eq!(model_dir(path), Ok(PathBuf::from(path)), "{path}");
        }
        let error = model_dir("zai-org/GLM 5").unwrap_err();
        assert!(error.contains("no file or folder `zai-org/GLM 5`") && error.contains("holds ` `"), "{error}");
        assert!(looks_like_repo_id("org/na--me@v1") && !looks_like_repo_id("~/name") && !looks_like_repo_id("a/b/c"));
    }
}
