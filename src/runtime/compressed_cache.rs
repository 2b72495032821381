//! DeepSeek-V4's per-request caches (one per layer), as the engines keep them per layer type: the sliding window's
//! last key rows, and on compressed layers the compressor's entries with the projections of the tokens of its open
//! window (CSA: and of its last closed window, which the next entry overlaps), on CSA layers the indexer's keys
//! alike. `crate::arch::compressed_attention` fills and reads them; the pool keeps their rows (window, entries,
//! indexer keys) in pages (`crate::runtime::kv_cache::CachePages`) and the rest in a request's state slot, whose
//! sizes [`CompressedShape::check`] checks.

/// One request's cache of one V4 layer, as the engines keep it per layer type: the last `sliding_window − 1` key
/// rows (the window before the next token), and on compressed layers the compressor's entries and pending window
/// ([`EntryCache`]), on CSA layers also the indexer's keys.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CompressedCache {
    /// Tokens seen: the position of the next one.
    pub tokens: usize,
    /// `[≤ sliding_window − 1, head_dim]`, oldest first.
    pub window: Vec<f32>,
    pub entries: Option<EntryCache>,
    pub index: Option<EntryCache>,
}

/// What one request keeps of one compressor: its entries `[n, dim]`, the projections (values, gates `[k, width]`) of
/// the tokens of its incomplete window, and with overlap those of its last complete window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EntryCache {
    pub entries: Vec<f32>,
    pub pending: [Vec<f32>; 2],
    pub previous: [Vec<f32>; 2],
}

/// What one V4 layer's cache holds per token, for the size checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerCacheShape {
    /// 0 (sliding window only), 4 (CSA) or 128 (HCA).
    pub ratio: usize,
    /// The compressor's entry width and its projections' width (`2 ·` with CSA's overlap).
    pub entry: [usize; 2],
    /// The indexer's key width and its projections' width (CSA), else zeros.
    pub index: [usize; 2],
}

/// The sizes every V4 layer's cache must have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompressedShape {
    pub window: usize,
    pub head_dim: usize,
    pub layers: Vec<LayerCacheShape>,
}

impl CompressedShape {
    /// Why `caches` (one per layer, as a state slot keeps them: their rows in pages) are not a consistent cache of
    /// at most `tokens` tokens, if they are not: one per layer, the layers at one token count (or, within a decode
    /// step, the first ones one token ahead), each holding no row (window, entries, indexer keys) and exactly the
    /// pending projections its count implies.
    pub fn check(&self, caches: &[&CompressedCache], tokens: usize) -> Result<(), String> {
        if caches.len() != self.layers.len() {
            return Err(format!("holds {} layer caches; the model has {} layers", caches.len(), self.layers.len()));
        }
        let first = caches.first().map_or(0, |cache| cache.tokens);
        if first > tokens {
            return Err(format!("holds {first} tokens, more than the {tokens} positions the request's pages reserve"));
        }
        for (layer, (cache, shape)) in caches.iter().zip(&self.layers).enumerate() {
            let problem = |what: String| Err(format!("layer {layer}: {what}"));
            let seen = cache.tokens;
            let previous = if layer == 0 { seen } else { caches[layer - 1].tokens };
            if seen > previous || first > seen + 1 {
                return problem(format!("holds {seen} tokens, layer {} {previous}, layer 0 {first}", layer.max(1) - 1));
            }
            if !cache.window.is_empty() {
                return problem(format!(
                    "holds {} window values; the window's rows belong in pages",
                    cache.window.len()
                ));
            }
            let compressors =
                [(cache.entries.as_ref(), shape.ratio, shape.entry), (cache.index.as_ref(), 4, shape.index)];
            for (kind, (entries, ratio, [dim, width])) in ["entries", "index keys"].iter().zip(compressors) {
                match entries {
                    None if dim == 0 || ratio == 0 => {}
                    Some(entries) if dim > 0 && ratio > 0 => {
                        let overlap = width > dim && seen >= ratio;
                        let expected = [0, seen % ratio * width, if overlap { ratio * width } else { 0 }];
                        let held = [entries.entries.len(), entries.pending[0].len(), entries.previous[0].len()];
                        let pairs = entries.pending[0].len() == entries.pending[1].len()
                            && entries.previous[0].len() == entries.previous[1].len();
                        if held != expected || !pairs {
                            return problem(format!(
                                "{kind} hold (entries, pending, previous) = {held:?} values; {seen} tokens make {expected:?}"
                            ));
                        }
                    }
                    _ => return problem(format!("{kind}: present where the layer has none, or missing")),
                }
            }
        }
        Ok(())
    }

    /// Bytes a request's state slot holds after `tokens` tokens: the compressors' pending projections (f32, as the
    /// runtime keeps them; the rows are in pages).
    pub fn slot_bytes(&self, tokens: usize) -> usize {
        let compressor = |ratio: usize, [dim, width]: [usize; 2]| {
            if ratio == 0 || dim == 0 {
                return 0;
            }
            (tokens % ratio + if width > dim && tokens >= ratio { ratio } else { 0 }) * 2 * width
        };
        4 * self.layers.iter().map(|l| compressor(l.ratio, l.entry) + compressor(4, l.index)).sum::<usize>()
    }
}
