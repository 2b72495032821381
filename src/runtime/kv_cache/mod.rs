//! Paged KV cache: a pool of fixed-size pages, a free list, per-request block tables, and a tag on every physical
//! page (owner request, logical page index, allocation generation) that [`KvPool::verify`] checks for every mapping
//! before each decode step.
//!
//! # Layout
//! A page holds `page_size` token positions of every layer: `[layers, page_size, row_width]` elements in the pool's
//! [`KvDtype`], plus `[layers, page_size, aux_width]` f32 values kept beside it (GLM-5's DSA indexer keys,
//! GLM-5.3-Flash's k-pool keys beside their gate scores, which the decode step's top-k selection scores; 0 wide for
//! other models). A row is what the engines cache per token and
//! layer: MLA the 576-wide latent (`kv_c_normed` 512 + post-RoPE `k_pe` 64), GQA `[K heads·dim, V heads·dim]`.
//! Bytes per page: `layers · page_size · (row_width · dtype + aux_width · 4)`.
//!
//! # Whose pages
//! The page table (tags, block tables, free list, [`KvPool::verify`]) is the pool's, on the host, shared by every
//! backend. The cached rows and aux values belong to the backend that computes on them: the CPU backend's are the
//! pool's host pages ([`KvPool::write`] / [`KvPool::read`], allocated on the first host write); a device backend
//! keeps its own with the pool ([`KvPool::keep_resident`]) and records what it wrote with [`KvPool::record`], so a
//! device decode never holds a host copy of them. A KDA model's per-request states sit in state slots beside the
//! pages ([`states`], reached through the pool in [`pool_states`]).

mod cache_pages;
mod fault;
mod pool_states;
mod states;
mod step;
mod storage;

use std::any::Any;
use std::collections::BTreeMap;

/// The pool's element type (an on-disk convention shared with the KV-scale files and `report`).
pub use crate::format::kv_scales::KvDtype;
pub use cache_pages::{CacheKind, CachePages, KindUse, RowPageTag, RowTable};
pub use fault::{inject, Fault, FaultKind, InjectedFault};
pub use states::{LayerState, SlotKind, SlotTag, StateSlots};
pub use step::{KeyChoice, KvAt, KvRows, PagedDecode, PagedLayout, PagedStep};

/// A request's id as the pool knows it.
pub type RequestId = u64;

/// What a physical page says about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageTag {
    pub owner: RequestId,
    /// Logical page index within the owner's block table.
    pub index: u32,
    /// Allocation generation: unique per allocation, so a page freed and reallocated is told apart.
    pub generation: u64,
}

/// One block-table entry: the physical page and the generation it was given with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    pub page: u32,
    pub generation: u64,
}

/// A request's block table: logical page `i` lives in `entries[i]`; `tokens` positions are written; on a model
/// with KDA layers, `state` maps the request's state slot (`page` = the slot).
#[derive(Debug, Clone, Default)]
pub struct BlockTable {
    pub entries: Vec<Mapping>,
    pub tokens: usize,
    pub state: Option<Mapping>,
}

/// Geometry of a pool.
#[derive(Debug, Clone, Copy)]
pub struct PoolShape {
    pub layers: usize,
    pub row_width: usize,
    pub aux_width: usize,
    pub page_size: usize,
    pub pages: usize,
}

impl PoolShape {
    pub fn page_bytes(&self, dtype: KvDtype) -> usize {
        self.layers * self.page_size * (self.row_width * dtype.bytes() + self.aux_width * 4)
    }

    pub fn pages_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.page_size)
    }
}

/// Integrity counters.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Counters {
    pub mappings_verified: u64,
    pub faults_detected: u64,
    pub requests_aborted: u64,
    /// Pages returned to the free list by [`KvPool::truncate`] (rejected speculative drafts).
    pub pages_rolled_back: u64,
}

/// Why a request's mappings are not trustworthy. The message names the page and the disagreement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IntegrityError {
    #[error("request {request}: logical page {index} maps to physical page {page}, outside the pool of {pages} pages")]
    OutOfRange { request: RequestId, index: usize, page: u32, pages: usize },
    #[error("request {request}: logical page {index} maps to physical page {page}, which is on the free list")]
    OnFreeList { request: RequestId, index: usize, page: u32 },
    #[error(
        "request {request}: logical page {index} maps to physical page {page}, which has no tag (never allocated)"
    )]
    Untagged { request: RequestId, index: usize, page: u32 },
    #[error("request {request}: logical page {index} maps to physical page {page}, whose tag disagrees on {field}: expected {expected}, found {found}")]
    TagMismatch { request: RequestId, index: usize, page: u32, field: &'static str, expected: u64, found: u64 },
    #[error("request {request}: the block table has {entries} pages but {tokens} written tokens need {needed}")]
    Length { request: RequestId, entries: usize, tokens: usize, needed: usize },
    #[error("request {request}: has no state slot, but the model's KDA layers or DeepSeek-V4 caches need one")]
    NoState { request: RequestId },
    #[error("request {request}: its state slot {slot} {problem}")]
    StateSlot { request: RequestId, slot: u32, problem: String },
    #[error("request {request}: layer {layer}'s {kind} {problem}")]
    CachePage { request: RequestId, layer: usize, kind: &'static str, problem: String },
}

/// Errors of pool operations (not integrity faults).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("the KV pool has no free page (all {0} pages in use)")]
    Full(usize),
    #[error("DeepSeek-V4's {kind} pages are all in use ({pages} pages); raise --kv-pages")]
    CacheFull { kind: &'static str, pages: usize },
    #[error("request {0} has no block table")]
    Unknown(RequestId),
    #[error(transparent)]
    Integrity(#[from] IntegrityError),
    #[error("request {request}: logical page {index} disagrees with its page tag on the device, but the host tags agree (the device copy of the tags is stale)")]
    DeviceTags { request: RequestId, index: usize },
}

/// The page pool with its tags, free list and block tables.
pub struct KvPool {
    shape: PoolShape,
    dtype: KvDtype,
    /// Per layer, one scale per row element (FP8 only; 1.0 otherwise).
    scales: Vec<Vec<f32>>,
    /// The host pages `[pages, layers, page_size, row_width]` in `dtype` and their aux values `[pages, layers,
    /// page_size, aux_width]` (both empty until the first host write).
    data: Vec<u8>,
    aux: Vec<f32>,
    tags: Vec<Option<PageTag>>,
    on_free: Vec<bool>,
    /// LIFO: the page freed last is handed out next.
    free: Vec<u32>,
    next_generation: u64,
    tables: BTreeMap<RequestId, BlockTable>,
    pub counters: Counters,
    peak_used: usize,
    /// Most bytes the state slots held at once.
    peak_state_bytes: usize,
    /// Rows written into the host pages so far, and changes of tags / free-list state so far: a backend's resident
    /// copy compares them with what it has mirrored.
    writes: u64,
    tag_version: u64,
    /// A device backend's copy of this pool where it computes (its device pages and tags), kept with the pool so
    /// that it lives and dies with it; the backend owns what it is (the pool names no backend).
    resident: Option<Box<dyn Any + Send>>,
    /// The KDA layers' per-request state slots (none without KDA layers).
    states: StateSlots,
    /// DeepSeek-V4's cached rows, a page group per cache kind (none for other models).
    cache_pages: Option<CachePages>,
}

impl KvPool {
    /// A pool whose FP8 elements use `scales[layer][element]` (`row_width` per layer).
    pub fn new(shape: PoolShape, dtype: KvDtype, scales: Vec<Vec<f32>>) -> Self {
        assert_eq!(scales.len(), shape.layers, "one scale row per layer");
        Self {
            shape,
            dtype,
            scales,
            data: Vec::new(),
            aux: Vec::new(),
            tags: vec![None; shape.pages],
            on_free: vec![true; shape.pages],
            free: (0..shape.pages as u32).rev().collect(),
            next_generation: 1,
            tables: BTreeMap::new(),
            counters: Counters::default(),
            peak_used: 0,
            peak_state_bytes: 0,
            writes: 0,
            tag_version: 0,
            resident: None,
            states: StateSlots::default(),
            cache_pages: None,
        }
    }

    pub fn shape(&self) -> PoolShape {
        self.shape
    }

    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    pub fn free_pages(&self) -> usize {
        self.free.len()
    }

    pub fn used_pages(&self) -> usize {
        self.shape.pages - self.free.len()
    }

    /// Most pages in use at any time.
    pub fn peak_used_pages(&self) -> usize {
        self.peak_used
    }

    /// The host pages' bytes `[pages, layers, page_size, row_width]` (what a device pool mirrors), `None` before
    /// the first host write.
    pub fn page_data(&self) -> Option<&[u8]> {
        (!self.data.is_empty()).then_some(&self.data[..])
    }

    /// Bytes of the host pages once allocated.
    fn data_bytes(&self) -> usize {
        self.shape.pages * self.shape.layers * self.shape.page_size * self.shape.row_width * self.dtype.bytes()
    }

    /// Physical page `page`'s tag and whether it is on the free list.
    pub fn page_state(&self, page: usize) -> (Option<PageTag>, bool) {
        (self.tags[page], self.on_free[page])
    }

    /// `layer`'s per-element scales (`row_width` values).
    pub fn layer_scales(&self, layer: usize) -> &[f32] {
        &self.scales[layer]
    }

    pub fn table(&self, request: RequestId) -> Option<&BlockTable> {
        self.tables.get(&request)
    }

    pub fn requests(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.tables.keys().copied()
    }

    /// Rows written into the host pages since the pool was created.
    pub fn writes(&self) -> u64 {
        self.writes
    }

    /// Changes of page tags or free-list state since the pool was created (allocations, releases, injected faults).
    pub fn tag_version(&self) -> u64 {
        self.tag_version
    }

    /// Takes the backend copy kept with the pool (see [`KvPool::keep_resident`]).
    pub(crate) fn take_resident(&mut self) -> Option<Box<dyn Any + Send>> {
        self.resident.take()
    }

    /// Keeps the device backend's copy of the pool with it until taken back.
    pub(crate) fn keep_resident(&mut self, resident: Box<dyn Any + Send>) {
        self.resident = Some(resident);
    }

    /// Starts an empty block table for `request`.
    pub fn open(&mut self, request: RequestId) {
        self.tables.entry(request).or_default();
    }

    /// Allocates pages so that `request` can hold `tokens` positions.
    pub fn reserve(&mut self, request: RequestId, tokens: usize) -> Result<(), PoolError> {
        let needed = self.shape.pages_for(tokens);
        let have = self.tables.get(&request).ok_or(PoolError::Unknown(request))?.entries.len();
        for index in have..needed {
            let page = self.free.pop().ok_or(PoolError::Full(self.shape.pages))?;
            let generation = self.next_generation;
            self.next_generation += 1;
            self.on_free[page as usize] = false;
            self.tags[page as usize] = Some(PageTag { owner: request, index: index as u32, generation });
            self.tag_version += 1;
            let table = self.tables.get_mut(&request).ok_or(PoolError::Unknown(request))?;
            table.entries.push(Mapping { page, generation });
        }
        self.peak_used = self.peak_used.max(self.used_pages());
        Ok(())
    }

    /// The slot (physical page · page_size + offset) `request`'s `position` maps to.
    pub fn slot(&self, request: RequestId, position: usize) -> Result<usize, PoolError> {
        let table = self.tables.get(&request).ok_or(PoolError::Unknown(request))?;
        let index = position / self.shape.page_size;
        let mapping = table.entries.get(index).ok_or(PoolError::Full(self.shape.pages))?;
        if mapping.page as usize >= self.shape.pages {
            return Err(
                IntegrityError::OutOfRange { request, index, page: mapping.page, pages: self.shape.pages }.into()
            );
        }
        Ok(mapping.page as usize * self.shape.page_size + position % self.shape.page_size)
    }

    /// Writes one position's row into the host pages (and its aux values) of `layer`; the position must be reserved.
    pub fn write(
        &mut self,
        request: RequestId,
        layer: usize,
        position: usize,
        row: &[f32],
        aux: &[f32],
    ) -> Result<(), PoolError> {
        let PoolShape { layers, aux_width, page_size, .. } = self.shape;
        let slot = self.record(request, position)?;
        if self.data.is_empty() {
            self.data = vec![0u8; self.data_bytes()];
            self.aux = vec![0f32; self.shape.pages * layers * page_size * aux_width];
        }
        let element = ((slot / page_size) * layers + layer) * page_size + slot % page_size;
        let bytes = self.shape.row_width * self.dtype.bytes();
        storage::encode(self.dtype, row, &self.scales[layer], &mut self.data[element * bytes..][..bytes]);
        self.aux[element * aux_width..][..aux_width].copy_from_slice(&aux[..aux_width]);
        self.writes += 1;
        Ok(())
    }

    /// Records that `request`'s `position` was written where its backend keeps the rows (its own pages); returns
    /// the slot (page · page_size + offset) the row belongs to.
    pub fn record(&mut self, request: RequestId, position: usize) -> Result<usize, PoolError> {
        let slot = self.slot(request, position)?;
        let table = self.tables.get_mut(&request).ok_or(PoolError::Unknown(request))?;
        table.tokens = table.tokens.max(position + 1);
        Ok(slot)
    }

    /// Whether the mapping that holds `request`'s `position` agrees with its page's tag (the one check a write
    /// needs so that it never lands in another request's page).
    pub fn mapping_agrees(&self, request: RequestId, position: usize) -> bool {
        let Some(table) = self.tables.get(&request) else { return false };
        let index = position / self.shape.page_size;
        let Some(mapping) = table.entries.get(index) else { return false };
        let page = mapping.page as usize;
        page < self.shape.pages
            && !self.on_free[page]
            && self.tags[page] == Some(PageTag { owner: request, index: index as u32, generation: mapping.generation })
    }

    /// Reads the aux values of positions `0..count` of `layer` into `aux` (`[count, aux_width]`).
    pub fn read_aux(
        &self,
        request: RequestId,
        layer: usize,
        count: usize,
        aux: &mut Vec<f32>,
    ) -> Result<(), PoolError> {
        let PoolShape { layers, aux_width, page_size, .. } = self.shape;
        aux.resize(count * aux_width, 0.0);
        let mut position = 0;
        while position < count {
            let slot = self.slot(request, position)?;
            let (page, offset) = (slot / page_size, slot % page_size);
            let run = (page_size - offset).min(count - position);
            let element = (page * layers + layer) * page_size + offset;
            let target = &mut aux[position * aux_width..][..run * aux_width];
            match self.aux.get(element * aux_width..(element + run) * aux_width) {
                Some(values) => target.copy_from_slice(values),
                None => target.fill(0.0),
            }
            position += run;
        }
        Ok(())
    }

    /// Reads positions `0..count` of `layer` from the host pages into `rows` (`[count, row_width]`; zeros where the
    /// host never wrote) and `aux` (`[count, aux_width]`).
    pub fn read(
        &self,
        request: RequestId,
        layer: usize,
        count: usize,
        rows: &mut Vec<f32>,
        aux: &mut Vec<f32>,
    ) -> Result<(), PoolError> {
        let PoolShape { layers, row_width, aux_width, page_size, .. } = self.shape;
        rows.resize(count * row_width, 0.0);
        aux.resize(count * aux_width, 0.0);
        let bytes = row_width * self.dtype.bytes();
        let mut position = 0;
        while position < count {
            let slot = self.slot(request, position)?;
            let (page, offset) = (slot / page_size, slot % page_size);
            let run = (page_size - offset).min(count - position);
            let element = (page * layers + layer) * page_size + offset;
            let target = &mut rows[position * row_width..][..run * row_width];
            match self.data.get(element * bytes..(element + run) * bytes) {
                Some(data) => storage::decode(self.dtype, data, &self.scales[layer].repeat(run), target),
                None => target.fill(0.0),
            }
            let target = &mut aux[position * aux_width..][..run * aux_width];
            match self.aux.get(element * aux_width..(element + run) * aux_width) {
                Some(values) => target.copy_from_slice(values),
                None => target.fill(0.0),
            }
            position += run;
        }
        Ok(())
    }

    /// Checks every mapping of `request`: page id in range, page not on the free list, tag owner, logical index and
    /// generation equal to what the table recorded. Counts the mappings checked.
    pub fn verify(&mut self, request: RequestId) -> Result<(), IntegrityError> {
        let state =
            usize::from(self.states.used()) + self.cache_pages.as_ref().map_or(0, |pages| pages.mapped(request));
        self.counters.mappings_verified +=
            self.tables.get(&request).map_or(0, |table| (table.entries.len() + state) as u64);
        let result = self.check(request);
        if result.is_err() {
            self.counters.faults_detected += 1;
        }
        result
    }

    /// [`KvPool::verify`]'s checks without counting (to name the fault a device reported).
    pub fn check(&self, request: RequestId) -> Result<(), IntegrityError> {
        let Some(table) = self.tables.get(&request) else { return Ok(()) };
        check_table(request, table, &self.tags, &self.on_free, self.shape.pages_for(table.tokens))?;
        self.states.check(request, table.state, table.entries.len() * self.shape.page_size)?;
        match (&self.cache_pages, table.state) {
            (Some(pages), Some(mapping)) => pages.check(request, &self.states.layer_tokens(mapping)),
            _ => Ok(()),
        }
    }

    /// Returns `request`'s pages to the free list and drops its table. A finished request frees its (verified)
    /// mappings; an aborted one frees every page whose tag names it, wherever it is mapped, and leaves pages whose
    /// tags are damaged out of circulation (quarantined).
    pub fn release(&mut self, request: RequestId, aborted: bool) {
        let Some(table) = self.tables.remove(&request) else { return };
        self.states.release(request, table.state, aborted);
        if let Some(pages) = &mut self.cache_pages {
            pages.release(request, aborted);
        }
        if aborted {
            self.counters.requests_aborted += 1;
            for page in 0..self.shape.pages {
                if !self.on_free[page] && self.tags[page].is_some_and(|tag| tag.owner == request) {
                    self.free_page(page as u32);
                }
            }
        } else {
            for (index, mapping) in table.entries.iter().enumerate() {
                let page = mapping.page as usize;
                let expected = PageTag { owner: request, index: index as u32, generation: mapping.generation };
                if page < self.shape.pages && !self.on_free[page] && self.tags[page] == Some(expected) {
                    self.free_page(mapping.page);
                }
            }
        }
    }

    /// Rolls `request` back to its first `tokens` positions (the rows of rejected speculative drafts): every page
    /// the shorter length no longer needs leaves the block table and, where its tag still names this request at
    /// that logical index, goes back to the free list with its tag cleared (a page whose tag disagrees stays out of
    /// circulation, as an aborted request's does). Returns the pages freed.
    pub fn truncate(&mut self, request: RequestId, tokens: usize) -> Result<usize, PoolError> {
        self.roll_back(request, tokens, true)
    }

    /// [`KvPool::truncate`]; with `unmap` false the freed pages stay in the table (the rollback bug that
    /// [`FaultKind::RollbackStale`] injects).
    fn roll_back(&mut self, request: RequestId, tokens: usize, unmap: bool) -> Result<usize, PoolError> {
        let keep = self.shape.pages_for(tokens);
        let table = self.tables.get_mut(&request).ok_or(PoolError::Unknown(request))?;
        table.tokens = table.tokens.min(tokens);
        let dropped: Vec<(usize, Mapping)> = table.entries.iter().copied().enumerate().skip(keep).collect();
        if unmap {
            table.entries.truncate(keep);
        }
        let mut freed = 0;
        for (index, mapping) in dropped {
            let page = mapping.page as usize;
            let expected = PageTag { owner: request, index: index as u32, generation: mapping.generation };
            if page < self.shape.pages && !self.on_free[page] && self.tags[page] == Some(expected) {
                self.free_page(mapping.page);
                freed += 1;
            }
        }
        self.counters.pages_rolled_back += freed as u64;
        Ok(freed)
    }

    fn free_page(&mut self, page: u32) {
        self.tag_version += 1;
        self.tags[page as usize] = None;
        self.on_free[page as usize] = true;
        self.free.push(page);
    }

    /// Mutable access for fault injection.
    fn parts(&mut self) -> Parts<'_> {
        self.tag_version += 1;
        Parts { tables: &mut self.tables, tags: &mut self.tags, on_free: &mut self.on_free, free: &mut self.free }
    }
}

struct Parts<'a> {
    tables: &'a mut BTreeMap<RequestId, BlockTable>,
    tags: &'a mut Vec<Option<PageTag>>,
    on_free: &'a mut Vec<bool>,
    free: &'a mut Vec<u32>,
}

fn check_table(
    request: RequestId,
    table: &BlockTable,
    tags: &[Option<PageTag>],
    on_free: &[bool],
    needed: usize,
) -> Result<(), IntegrityError> {
    if table.entries.len() < needed {
        return Err(IntegrityError::Length { request, entries: table.entries.len(), tokens: table.tokens, needed });
    }
    for (index, mapping) in table.entries.iter().enumerate() {
        let page = mapping.page;
        if page as usize >= tags.len() {
            return Err(IntegrityError::OutOfRange { request, index, page, pages: tags.len() });
        }
        if on_free[page as usize] {
            return Err(IntegrityError::OnFreeList { request, index, page });
        }
        let Some(tag) = tags[page as usize] else {
            return Err(IntegrityError::Untagged { request, index, page });
        };
        let mismatch = |field, expected: u64, found: u64| IntegrityError::TagMismatch {
            request,
            index,
            page,
            field,
            expected,
            found,
        };
        if tag.owner != request {
            return Err(mismatch("owner", request, tag.owner));
        }
        if tag.index as usize != index {
            return Err(mismatch("logical index", index as u64, tag.index as u64));
        }
        if tag.generation != mapping.generation {
            return Err(mismatch("generation", mapping.generation, tag.generation));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(pages: usize, page_size: usize, dtype: KvDtype) -> KvPool {
        let shape = PoolShape { layers: 2, row_width: 5, aux_width: 2, page_size, pages };
        KvPool::new(shape, dtype, vec![vec![0.1; 5]; 2])
    }

    #[test]
    fn write_read_across_pages_and_release() {
        let mut pool = pool(6, 3, KvDtype::F32);
        pool.open(7);
        pool.reserve(7, 7).unwrap();
        assert_eq!(pool.used_pages(), 3);
        for position in 0..7 {
            let row: Vec<f32> = (0..5).map(|e| (position * 10 + e) as f32).collect();
            pool.write(7, 1, position, &row, &[position as f32, -1.0]).unwrap();
        }
        let (mut rows, mut aux) = (Vec::new(), Vec::new());
        pool.read(7, 1, 7, &mut rows, &mut aux).unwrap();
        assert_eq!(rows[6 * 5 + 4], 64.0);
        assert_eq!(aux[5 * 2], 5.0);
        pool.verify(7).unwrap();
        assert_eq!(pool.counters.mappings_verified, 3);
        pool.release(7, false);
        assert_eq!(pool.free_pages(), 6);
        assert_eq!(pool.reserve(7, 1), Err(PoolError::Unknown(7)));
    }

    #[test]
    fn truncate_frees_the_pages_of_rejected_positions_and_keeps_the_rest() {
        let mut pool = pool(8, 2, KvDtype::F32);
        pool.open(3);
        pool.reserve(3, 7).unwrap();
        for position in 0..7 {
            pool.write(3, 0, position, &[position as f32; 5], &[0.0; 2]).unwrap();
        }
        assert_eq!(pool.truncate(3, 3).unwrap(), 2);
        assert_eq!(pool.table(3).unwrap().entries.len(), 2);
        assert_eq!(pool.table(3).unwrap().tokens, 3);
        assert_eq!((pool.used_pages(), pool.counters.pages_rolled_back), (2, 2));
        pool.verify(3).unwrap();
        let (mut rows, mut aux) = (Vec::new(), Vec::new());
        pool.read(3, 0, 3, &mut rows, &mut aux).unwrap();
        assert_eq!(rows[2 * 5], 2.0);
        // Within the kept page nothing is freed; the table only forgets the position.
        assert_eq!(pool.truncate(3, 2).unwrap(), 1);
        assert_eq!(pool.truncate(3, 2).unwrap(), 0);
        assert_eq!(pool.table(3).unwrap().tokens, 2);
        assert_eq!(pool.truncate(9, 0), Err(PoolError::Unknown(9)));
    }

    #[test]
    fn every_state_fault_is_detected_and_only_its_victims_fail() {
        use crate::runtime::kda::{KdaShape, KdaState};
        let shape = KdaShape { heads: 2, head_dim: 4, conv_kernel: 3 };
        for kind in FaultKind::STATE {
            let mut pool = pool(16, 2, KvDtype::Bf16).with_states(shape, 2);
            for request in 0..3 {
                pool.open(request);
                pool.reserve(request, 5).unwrap();
                pool.store_states(request, vec![LayerState::Kda(KdaState::new(&shape)); 2]).unwrap();
            }
            assert!((0..3).all(|r| pool.verify(r).is_ok()));
            let injected = inject(&mut pool, kind, 1, &[0, 1, 2]).expect("injectable");
            // A new request may take a freed slot: the victim must still be caught.
            pool.open(3);
            pool.store_states(3, vec![LayerState::Kda(KdaState::new(&shape)); 2]).unwrap();
            let failed: Vec<RequestId> = (0..4).filter(|&r| pool.verify(r).is_err()).collect();
            assert_eq!(failed, injected.affected, "{kind:?}");
            assert!(injected.affected.iter().all(|&r| pool.states_mut(r).is_err()), "{kind:?}");
            for request in failed {
                pool.release(request, true);
            }
            for request in [0, 2, 3].into_iter().filter(|r| !injected.affected.contains(r)) {
                assert_eq!(pool.states_mut(request).unwrap().len(), 2, "{kind:?}: request {request} keeps its states");
            }
        }
        // A request without a slot in a pool that keeps states is caught too.
        let mut pool = pool(4, 2, KvDtype::Bf16).with_states(shape, 1);
        pool.open(9);
        assert_eq!(pool.verify(9), Err(IntegrityError::NoState { request: 9 }));
    }

    #[test]
    fn every_fault_kind_is_detected_and_only_the_victim_fails() {
        for kind in FaultKind::ALL {
            let mut pool = pool(16, 2, KvDtype::Bf16);
            for request in 0..3 {
                pool.open(request);
                pool.reserve(request, 5).unwrap();
                for position in 0..5 {
                    pool.write(request, 0, position, &[1.0; 5], &[0.0; 2]).unwrap();
                }
            }
            let injected = inject(&mut pool, kind, 1, &[0, 1, 2]).expect("injectable");
            // The next allocation may take a stale page: the victim must still be caught.
            pool.reserve(2, 7).unwrap();
            let failed: Vec<RequestId> = (0..3).filter(|&r| pool.verify(r).is_err()).collect();
            assert_eq!(failed, injected.affected, "{kind:?}");
            for request in failed {
                pool.release(request, true);
            }
            assert_eq!(pool.counters.requests_aborted as usize, injected.affected.len());
        }
    }
}
