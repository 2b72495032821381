//! The KV pool a serve-test run allocates: its page count (`--kv-pages`, or a share of available memory) and the
//! checks that the pool fits in memory and that every request fits in the pool.

use crate::format::kv_scales::KvDtype;
use crate::runtime::kv_cache::PoolShape;

use super::ServeError;

/// Pool size when `--kv-pages` is not given: this share of available memory, at most `MAX_DEFAULT_PAGES`.
const DEFAULT_MEMORY_SHARE: f64 = 0.25;
const MAX_DEFAULT_PAGES: usize = 1 << 16;

/// Sets `shape.pages` from `kv_pages` (or available memory) and refuses a pool that does not fit in memory: the pool
/// is allocated up front, so a failed allocation would abort rather than report.
pub fn size_pool(shape: &mut PoolShape, kv_dtype: KvDtype, kv_pages: Option<usize>) -> Result<(), ServeError> {
    let page_bytes = shape.page_bytes(kv_dtype);
    let available = available_memory().unwrap_or(1 << 30);
    shape.pages = match kv_pages {
        Some(pages) => pages,
        None => {
            let memory = available as f64 * DEFAULT_MEMORY_SHARE;
            ((memory / page_bytes as f64) as usize).clamp(1, MAX_DEFAULT_PAGES)
        }
    };
    let pool_bytes = (shape.pages as u64).checked_mul(page_bytes as u64);
    if pool_bytes.is_none_or(|bytes| bytes > available) {
        return Err(ServeError::Input(format!(
            "the KV pool of {} pages × {} bytes (--page-size {} tokens, {} layers) needs {} but {} of memory is \
             available; lower --page-size or --kv-pages",
            shape.pages,
            page_bytes,
            shape.page_size,
            shape.layers,
            pool_bytes.map_or("more than 2^64 bytes".into(), crate::units::both_units),
            crate::units::both_units(available)
        )));
    }
    Ok(())
}

/// Pages each request needs for its prompt plus `max_new_tokens`; refuses a request that cannot fit in the pool.
pub fn pages_needed(shape: &PoolShape, encoded: &[Vec<u32>], max_new_tokens: usize) -> Result<Vec<usize>, ServeError> {
    let need: Vec<usize> = encoded.iter().map(|p| shape.pages_for(p.len() + max_new_tokens)).collect();
    for (index, prompt) in encoded.iter().enumerate() {
        if shape.pages_for(prompt.len()) > shape.pages {
            return Err(ServeError::Input(format!(
                "prompt {index} has {} tokens, longer than the KV pool ({} pages × {} tokens = {}); raise --kv-pages or --page-size",
                prompt.len(),
                shape.pages,
                shape.page_size,
                shape.pages * shape.page_size
            )));
        }
        if need[index] > shape.pages {
            return Err(ServeError::Input(format!(
                "--kv-pages {} is too small for one request: prompt {index} ({} tokens) + --max-new-tokens {} needs {} pages of {} tokens; raise --kv-pages",
                shape.pages, prompt.len(), max_new_tokens, need[index], shape.page_size
            )));
        }
    }
    Ok(need)
}

fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
}
