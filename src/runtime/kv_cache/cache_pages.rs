//! DeepSeek-V4's cached rows in pages, one page group per cache kind as the engines keep one KV-cache group per
//! layer type: the sliding window's key rows (`head_dim` wide, one per token), the compressed entries (`head_dim`,
//! one per `ratio` tokens) and the CSA indexer's keys (`index_head_dim`, one per 4 tokens). Each request has per
//! layer and kind a table of its pages ([`RowTable`]); every physical page carries a tag (owner, layer, logical
//! index, generation) that [`CachePages::check`] compares with the table before the rows are read. The window's
//! pages whose rows all fell out of the window are freed as the request advances.
//!
//! The request's state slot keeps what is not a row: each layer's token count and its compressors' projections of
//! the open window (and CSA's last closed one), as vLLM's compressor-state cache does. A decode step gathers a
//! layer's rows from the pages into the [`CompressedCache`] view the attention takes ([`CachePages::gather`]), then
//! writes the rows the step added and strips the view again ([`CachePages::scatter`]). Rows are kept as the step
//! computed them (f32; an FP8 pool's rows already rounded as vLLM stores them, [`crate::arch::v4_kv_fp8`]).

use std::collections::BTreeMap;
use std::ops::Range;

use super::{IntegrityError, Mapping, PoolError, RequestId};
use crate::runtime::compressed_cache::{CompressedCache, CompressedShape};

/// A DeepSeek-V4 cache kind with its own pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CacheKind {
    /// The sliding window's key rows (every layer).
    Window,
    /// The compressor's entries (CSA and HCA layers).
    Entries,
    /// The CSA indexer's compressed keys.
    IndexKeys,
}

impl CacheKind {
    pub const ALL: [CacheKind; 3] = [CacheKind::Window, CacheKind::Entries, CacheKind::IndexKeys];

    pub fn name(self) -> &'static str {
        match self {
            CacheKind::Window => "window",
            CacheKind::Entries => "entries",
            CacheKind::IndexKeys => "index-keys",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == text)
    }

    pub(super) fn slot(self) -> usize {
        self as usize
    }
}

/// What a cache page says about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowPageTag {
    pub owner: RequestId,
    pub layer: u32,
    /// Logical page index within the owner's table of this layer and kind.
    pub index: u32,
    pub generation: u64,
}

/// One request's pages of one layer's one kind: logical page `first + i` lives in `pages[i]`; rows `0..rows` were
/// written (the window's rows before `rows − (sliding_window − 1)` evicted, their pages freed and left out).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RowTable {
    pub first: usize,
    pub pages: Vec<Mapping>,
    pub rows: usize,
}

/// One kind's pages: `page_size` rows of `width` f32 each, made as needed up to `capacity`.
#[derive(Debug, Clone)]
pub(super) struct Group {
    pub width: usize,
    pub capacity: usize,
    data: Vec<f32>,
    pub tags: Vec<Option<RowPageTag>>,
    pub on_free: Vec<bool>,
    /// LIFO: the page freed last is handed out next.
    pub free: Vec<u32>,
    used: usize,
    peak_used: usize,
    /// Pages returned to the free list while their request went on (the window's evicted pages).
    evicted: u64,
}

/// Peak use of one kind's pages (for the report).
#[derive(Debug, Clone, serde::Serialize)]
pub struct KindUse {
    pub kind: CacheKind,
    /// Values per row.
    pub width: usize,
    pub page_bytes: usize,
    pub pages_peak: usize,
    /// Pages freed while their request went on: the window's pages whose rows all left the window.
    pub pages_evicted: u64,
}

/// DeepSeek-V4's cache pages: a group per kind and each request's tables.
#[derive(Debug, Clone)]
pub struct CachePages {
    page_size: usize,
    /// Rows the window keeps (`sliding_window − 1`, the rows before the next token).
    kept: usize,
    /// Per layer and kind, tokens per row (1, the compression ratio, 4), 0 where the layer has no such kind.
    ratios: Vec<[usize; 3]>,
    pub(super) groups: [Group; 3],
    pub(super) tables: BTreeMap<RequestId, Vec<[RowTable; 3]>>,
    next_generation: u64,
}

impl CachePages {
    /// Pages for caches of `shape`, `page_size` rows each; each kind may use `pool_pages` pages per layer that has
    /// it (what the pool's pages would hold were every token cached in every layer).
    pub fn new(shape: &CompressedShape, page_size: usize, pool_pages: usize) -> Self {
        let ratios: Vec<[usize; 3]> = shape
            .layers
            .iter()
            .map(|layer| {
                let entries = if layer.entry[0] > 0 { layer.ratio } else { 0 };
                let index = if layer.index[0] > 0 { 4 } else { 0 };
                [1, entries, index]
            })
            .collect();
        let widths = [
            shape.head_dim,
            shape.layers.iter().map(|l| l.entry[0]).max().unwrap_or(0),
            shape.layers.iter().map(|l| l.index[0]).max().unwrap_or(0),
        ];
        let groups = CacheKind::ALL.map(|kind| {
            let layers = ratios.iter().filter(|r| r[kind.slot()] > 0).count();
            Group {
                width: widths[kind.slot()],
                capacity: pool_pages * layers,
                data: Vec::new(),
                tags: Vec::new(),
                on_free: Vec::new(),
                free: Vec::new(),
                used: 0,
                peak_used: 0,
                evicted: 0,
            }
        });
        Self {
            page_size,
            kept: shape.window.saturating_sub(1),
            ratios,
            groups,
            tables: BTreeMap::new(),
            next_generation: 1,
        }
    }

    /// The logical pages a table of `kind` must map after `rows` rows: every page of a compressor's rows, the
    /// window's pages that hold one of its last `kept` rows.
    fn live_pages(&self, kind: CacheKind, rows: usize) -> Range<usize> {
        let start = match kind {
            CacheKind::Window => rows.saturating_sub(self.kept),
            _ => 0,
        };
        if start >= rows {
            return 0..0;
        }
        start / self.page_size..rows.div_ceil(self.page_size)
    }

    /// Rows of `kind` layer `layer` holds after `tokens` tokens (0 where the layer has none of that kind).
    fn rows_for(&self, layer: usize, kind: CacheKind, tokens: usize) -> usize {
        match self.ratios[layer][kind.slot()] {
            0 => 0,
            ratio => tokens / ratio,
        }
    }

    /// Mappings `request` holds (for the verification counters).
    pub fn mapped(&self, request: RequestId) -> usize {
        self.tables.get(&request).map_or(0, |layers| layers.iter().flatten().map(|t| t.pages.len()).sum())
    }

    /// Checks every table of `request` against its layers' token counts `tokens` (one per layer) and every mapping
    /// against its page's tag.
    pub fn check(&self, request: RequestId, tokens: &[usize]) -> Result<(), IntegrityError> {
        (0..tokens.len()).try_for_each(|layer| self.check_layer(request, layer, tokens[layer]))
    }

    /// [`CachePages::check`] for one layer at `tokens` tokens.
    pub fn check_layer(&self, request: RequestId, layer: usize, tokens: usize) -> Result<(), IntegrityError> {
        for kind in CacheKind::ALL {
            let fault = |problem: String| IntegrityError::CachePage { request, layer, kind: kind.name(), problem };
            let Some(table) = self.tables.get(&request).and_then(|layers| layers.get(layer)) else {
                return Err(fault("has no page table".into()));
            };
            let table = &table[kind.slot()];
            let rows = self.rows_for(layer, kind, tokens);
            let live = self.live_pages(kind, rows);
            if table.rows != rows || table.pages.len() != live.len() || (!live.is_empty() && table.first != live.start)
            {
                return Err(fault(format!(
                    "table maps logical pages {}..{} for {} rows; {tokens} tokens make {rows} rows in pages {live:?}",
                    table.first,
                    table.first + table.pages.len(),
                    table.rows
                )));
            }
            let group = &self.groups[kind.slot()];
            for (offset, mapping) in table.pages.iter().enumerate() {
                let index = table.first + offset;
                let expected = RowPageTag { owner: request, layer: layer as u32, index: index as u32, generation: 0 };
                if let Err(problem) = group.agrees(*mapping, expected) {
                    return Err(fault(format!(
                        "logical page {index} maps to physical page {}, {problem}",
                        mapping.page
                    )));
                }
            }
        }
        Ok(())
    }

    /// Fills `cache` (a stripped view: no rows) with `request`'s rows of `layer` from the pages, after checking the
    /// layer's tables and tags.
    pub fn gather(&self, request: RequestId, layer: usize, cache: &mut CompressedCache) -> Result<(), IntegrityError> {
        self.check_layer(request, layer, cache.tokens)?;
        let tables = &self.tables[&request][layer];
        for kind in CacheKind::ALL {
            let table = &tables[kind.slot()];
            let Some(target) = rows_of(cache, kind) else { continue };
            let first = match kind {
                CacheKind::Window => table.rows.saturating_sub(self.kept),
                _ => 0,
            };
            let group = &self.groups[kind.slot()];
            target.clear();
            target.reserve((table.rows - first) * group.width);
            for row in first..table.rows {
                let page = table.pages[row / self.page_size - table.first].page as usize;
                target.extend(group.row(page * self.page_size + row % self.page_size));
            }
        }
        Ok(())
    }

    /// Writes the rows `cache` holds past what `request`'s tables of `layer` hold (opening the tables on first use),
    /// frees the window's pages whose rows all left the window, and strips the rows from `cache`.
    pub fn scatter(&mut self, request: RequestId, layer: usize, cache: &mut CompressedCache) -> Result<(), PoolError> {
        let layers = self.ratios.len();
        self.tables.entry(request).or_insert_with(|| vec![Default::default(); layers]);
        for kind in CacheKind::ALL {
            let width = self.groups[kind.slot()].width;
            let Some(values) = rows_of(cache, kind).map(std::mem::take) else { continue };
            let rows = self.rows_for(layer, kind, cache.tokens);
            let held = values.len() / width.max(1);
            if held > rows || values.len() != held * width {
                return Err(PoolError::Integrity(IntegrityError::CachePage {
                    request,
                    layer,
                    kind: kind.name(),
                    problem: format!("holds {} values, not whole rows of {width} within {rows} rows", values.len()),
                }));
            }
            let written = self.tables[&request][layer][kind.slot()].rows;
            for row in written.max(rows - held)..rows {
                let slot = self.slot_for(request, layer, kind, row)?;
                let value = &values[(row + held - rows) * width..][..width];
                self.groups[kind.slot()].write(slot, value);
            }
            self.advance(request, layer, kind, rows);
        }
        Ok(())
    }

    /// The slot (page · page_size + offset) of `row`, allocating its page after the table's last one; refuses a
    /// page whose tag no longer names this table's row (a write never lands in another request's page).
    fn slot_for(&mut self, request: RequestId, layer: usize, kind: CacheKind, row: usize) -> Result<usize, PoolError> {
        let page_size = self.page_size;
        let index = row / page_size;
        let table = &self.tables[&request][layer][kind.slot()];
        let (first, mapped) = (table.first, table.pages.len());
        if mapped == 0 || index >= first + mapped {
            let generation = self.next_generation;
            self.next_generation += 1;
            let tag = RowPageTag { owner: request, layer: layer as u32, index: index as u32, generation };
            let page = self.groups[kind.slot()]
                .allocate(tag)
                .ok_or(PoolError::CacheFull { kind: kind.name(), pages: self.groups[kind.slot()].capacity })?;
            let table = &mut self.tables.get_mut(&request).expect("opened above")[layer][kind.slot()];
            if table.pages.is_empty() {
                table.first = index;
            }
            table.pages.push(Mapping { page, generation });
            return Ok(page as usize * page_size + row % page_size);
        }
        let mapping = table.pages[index - first];
        let expected = RowPageTag { owner: request, layer: layer as u32, index: index as u32, generation: 0 };
        self.groups[kind.slot()].agrees(mapping, expected).map_err(|problem| IntegrityError::CachePage {
            request,
            layer,
            kind: kind.name(),
            problem: format!("logical page {index} maps to physical page {}, {problem}", mapping.page),
        })?;
        Ok(mapping.page as usize * page_size + row % page_size)
    }

    /// Records `rows` rows written and frees the pages that no longer hold a live row (the window's).
    fn advance(&mut self, request: RequestId, layer: usize, kind: CacheKind, rows: usize) {
        let live = self.live_pages(kind, rows);
        let table = &mut self.tables.get_mut(&request).expect("opened by scatter")[layer][kind.slot()];
        table.rows = rows;
        let group = &mut self.groups[kind.slot()];
        while !table.pages.is_empty() && (live.is_empty() || table.first < live.start) {
            let mapping = table.pages.remove(0);
            let expected = RowPageTag { owner: request, layer: layer as u32, index: table.first as u32, generation: 0 };
            if group.agrees(mapping, expected).is_ok() {
                group.release(mapping.page);
                group.evicted += 1;
            }
            table.first += 1;
        }
        if table.pages.is_empty() {
            table.first = live.start;
        }
    }

    /// Returns `request`'s pages to the free lists and drops its tables: a finished request's mappings whose tags
    /// agree; for an `aborted` one every page whose tag names it (pages with damaged tags stay out of circulation).
    pub fn release(&mut self, request: RequestId, aborted: bool) {
        let Some(tables) = self.tables.remove(&request) else { return };
        if aborted {
            for group in &mut self.groups {
                for page in 0..group.tags.len() {
                    if !group.on_free[page] && group.tags[page].is_some_and(|tag| tag.owner == request) {
                        group.release(page as u32);
                    }
                }
            }
            return;
        }
        for (layer, kinds) in tables.iter().enumerate() {
            for (group, table) in self.groups.iter_mut().zip(kinds) {
                for (offset, mapping) in table.pages.iter().enumerate() {
                    let index = (table.first + offset) as u32;
                    let expected = RowPageTag { owner: request, layer: layer as u32, index, generation: 0 };
                    if group.agrees(*mapping, expected).is_ok() {
                        group.release(mapping.page);
                    }
                }
            }
        }
    }

    /// Peak use of each kind that some layer has.
    pub fn usage(&self) -> Vec<KindUse> {
        CacheKind::ALL
            .into_iter()
            .zip(&self.groups)
            .filter(|(kind, _)| self.ratios.iter().any(|ratios| ratios[kind.slot()] > 0))
            .map(|(kind, group)| KindUse {
                kind,
                width: group.width,
                page_bytes: self.page_size * group.width * 4,
                pages_peak: group.peak_used,
                pages_evicted: group.evicted,
            })
            .collect()
    }

    /// Most bytes the pages held at once, kind by kind.
    pub fn peak_bytes(&self) -> usize {
        self.usage().iter().map(|kind| kind.pages_peak * kind.page_bytes).sum()
    }
}

/// The rows of `kind` in a cache view (`None` where the layer has none of that kind).
fn rows_of(cache: &mut CompressedCache, kind: CacheKind) -> Option<&mut Vec<f32>> {
    match kind {
        CacheKind::Window => Some(&mut cache.window),
        CacheKind::Entries => cache.entries.as_mut().map(|entries| &mut entries.entries),
        CacheKind::IndexKeys => cache.index.as_mut().map(|index| &mut index.entries),
    }
}

impl Group {
    /// Why `mapping` does not hold the page tagged `expected` (its generation taken from the mapping), if it does
    /// not.
    pub(super) fn agrees(&self, mapping: Mapping, expected: RowPageTag) -> Result<(), String> {
        let page = mapping.page as usize;
        if page >= self.capacity {
            return Err(format!("outside the {} pages of its kind", self.capacity));
        }
        if page >= self.tags.len() || self.on_free[page] {
            return Err("which is on the free list".into());
        }
        let Some(tag) = self.tags[page] else { return Err("which has no tag".into()) };
        let fields = [
            ("owner", expected.owner, tag.owner),
            ("layer", expected.layer.into(), tag.layer.into()),
            ("logical index", expected.index.into(), tag.index.into()),
            ("generation", mapping.generation, tag.generation),
        ];
        match fields.into_iter().find(|(_, expected, found)| expected != found) {
            Some((field, expected, found)) => {
                Err(format!("whose tag disagrees on {field}: expected {expected}, found {found}"))
            }
            None => Ok(()),
        }
    }

    /// A page tagged `tag`: the one freed last, else a new one while under capacity.
    fn allocate(&mut self, tag: RowPageTag) -> Option<u32> {
        let page = match self.free.pop() {
            Some(page) => page,
            None if self.tags.len() < self.capacity => {
                self.tags.push(None);
                self.on_free.push(true);
                (self.tags.len() - 1) as u32
            }
            None => return None,
        };
        self.tags[page as usize] = Some(tag);
        self.on_free[page as usize] = false;
        self.used += 1;
        self.peak_used = self.peak_used.max(self.used);
        Some(page)
    }

    pub(super) fn release(&mut self, page: u32) {
        self.tags[page as usize] = None;
        self.on_free[page as usize] = true;
        self.free.push(page);
        self.used -= 1;
    }

    /// Row `slot` (page · page_size + offset); zeros where nothing was written there.
    fn row(&self, slot: usize) -> impl Iterator<Item = f32> + '_ {
        let values = self.data.get(slot * self.width..(slot + 1) * self.width).unwrap_or(&[]);
        values.iter().copied().chain(std::iter::repeat(0.0)).take(self.width)
    }

    fn write(&mut self, slot: usize, values: &[f32]) {
        let end = (slot + 1) * self.width;
        if self.data.len() < end {
            self.data.resize(end, 0.0);
        }
        self.data[slot * self.width..end].copy_from_slice(values);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{inject, Fault, KvDtype, KvPool, LayerState, PoolShape};
    use super::*;
    use crate::runtime::compressed_cache::{EntryCache, LayerCacheShape};

    /// A window of 5 (4 rows kept), a sliding layer, a CSA-like layer (ratio 4, overlapping, with indexer keys) and
    /// an HCA-like one (ratio 8).
    fn shape() -> CompressedShape {
        let layer = |ratio, entry, index| LayerCacheShape { ratio, entry, index };
        CompressedShape {
            window: 5,
            head_dim: 2,
            layers: vec![layer(0, [0, 0], [0, 0]), layer(4, [2, 4], [1, 2]), layer(8, [2, 2], [0, 0])],
        }
    }

    /// Request `request`'s cache of `layer` after `tokens` tokens, every row's values naming the request, layer,
    /// kind and row.
    fn cache(request: u64, layer: usize, tokens: usize) -> CompressedCache {
        let shape = shape();
        let value = |kind: usize, row: usize, column: usize| {
            (request * 100_000) as f32 + (layer * 10_000 + kind * 1000 + row) as f32 + column as f32 / 10.0
        };
        let rows = |kind: usize, range: std::ops::Range<usize>, width: usize| -> Vec<f32> {
            range.flat_map(|row| (0..width).map(move |column| value(kind, row, column))).collect()
        };
        let compressor = |kind: usize, ratio: usize, [dim, width]: [usize; 2]| {
            (ratio > 0 && dim > 0).then(|| {
                let pending = vec![0.5; tokens % ratio * width];
                let previous = if width > dim && tokens >= ratio { vec![0.25; ratio * width] } else { Vec::new() };
                EntryCache {
                    entries: rows(kind, 0..tokens / ratio, dim),
                    pending: [pending.clone(), pending],
                    previous: [previous.clone(), previous],
                }
            })
        };
        let at = shape.layers[layer];
        CompressedCache {
            tokens,
            window: rows(0, tokens.saturating_sub(shape.window - 1)..tokens, shape.head_dim),
            entries: compressor(1, at.ratio, at.entry),
            index: compressor(2, 4, at.index),
        }
    }

    fn caches(request: u64, tokens: usize) -> Vec<LayerState> {
        (0..3).map(|layer| LayerState::Compressed(Box::new(cache(request, layer, tokens)))).collect()
    }

    fn pool() -> KvPool {
        let tokens = PoolShape { layers: 0, row_width: 0, aux_width: 0, page_size: 2, pages: 64 };
        KvPool::new(tokens, KvDtype::F32, Vec::new()).with_compressed_states(shape())
    }

    /// Advances `request` from `tokens` to `tokens + 1` as a decode step does: each layer's cache taken out (its rows
    /// gathered from the pages, checked against what was written), replaced by the next one and given back.
    fn step(pool: &mut KvPool, request: u64, tokens: usize) -> Result<(), PoolError> {
        pool.reserve(request, tokens + 1)?;
        for layer in 0..3 {
            let Some(LayerState::Compressed(got)) = pool.take_state(request, layer)? else { panic!("a V4 cache") };
            assert_eq!(*got, cache(request, layer, tokens), "request {request} layer {layer} at {tokens} tokens");
            let next = LayerState::Compressed(Box::new(cache(request, layer, tokens + 1)));
            pool.restore_state(request, layer, next)?;
        }
        Ok(())
    }

    #[test]
    fn rows_come_back_as_written_and_the_window_frees_its_pages() {
        let mut pool = pool();
        pool.open(1);
        pool.reserve(1, 3).unwrap();
        pool.store_states(1, caches(1, 3)).unwrap();
        for tokens in 3..41 {
            pool.verify(1).unwrap();
            step(&mut pool, 1, tokens).unwrap();
        }
        let pages = pool.cache_pages().unwrap();
        let usage = pages.usage();
        // 4 kept rows in pages of 2 span at most 3 pages, on each of the 3 layers.
        assert!(usage[0].pages_peak <= 9 && usage[0].pages_evicted >= 3 * 17, "{usage:?}");
        // Entries: 41/4 = 10 rows (5 pages) on the CSA layer and 41/8 = 5 (3 pages) on the HCA one; index keys 10.
        assert_eq!([usage[1].pages_peak, usage[2].pages_peak], [8, 5], "{usage:?}");
        // At 41 tokens the window keeps rows 37…40: pages 18, 19 and 20 on each layer.
        assert_eq!(pages.mapped(1), 3 * 3 + 8 + 5, "window, entries, index keys");
        pool.release(1, false);
        let pages = pool.cache_pages().unwrap();
        assert!(pages.groups.iter().all(|group| group.used == 0) && pages.mapped(1) == 0);
    }

    #[test]
    fn every_page_fault_on_every_cache_kind_is_caught_and_only_its_victims_fail() {
        for cache in CacheKind::ALL {
            for kind in Fault::ON_CACHE_PAGES {
                let mut pool = pool();
                for request in 0..3 {
                    pool.open(request);
                    pool.reserve(request, 20).unwrap();
                    pool.store_states(request, caches(request, 20)).unwrap();
                }
                let injected = inject(&mut pool, Fault { kind, cache: Some(cache) }, 1, &[0, 1, 2]).expect("applies");
                assert_eq!(injected.cache, Some(cache));
                // A new request may take a freed page: the victim must still be caught, the newcomer not.
                pool.open(3);
                pool.reserve(3, 20).unwrap();
                pool.store_states(3, caches(3, 20)).unwrap();
                let failed: Vec<u64> = (0..4).filter(|&r| pool.verify(r).is_err()).collect();
                assert_eq!(failed, injected.affected, "{}", injected.description);
                for &request in &failed {
                    let read = (0..3).try_for_each(|layer| pool.take_state(request, layer).map(drop));
                    assert!(read.is_err(), "{kind:?} {cache:?}: a read of request {request} is refused too");
                    pool.release(request, true);
                }
                for request in (0..4).filter(|r| !failed.contains(r)) {
                    step(&mut pool, request, 20).unwrap();
                }
            }
        }
    }
}
