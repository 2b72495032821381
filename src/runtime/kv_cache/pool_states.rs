//! A request's states in and out of the pool (KDA states, DeepSeek-V4 caches): the slots made for a model's
//! stateful layers, a prefilled request's states stored under a new generation, a decode step's state moved out and
//! back, every access after the slot's tag and sizes are checked ([`super::states`] holds the slots themselves).

use super::states::LayerState;
use super::{CachePages, KvDtype, KvPool, PoolError, RequestId, StateSlots};
use crate::runtime::compressed_cache::CompressedShape;
use crate::runtime::kda::KdaShape;

impl KvPool {
    /// The pool with state slots for a model's `layers` KDA layers of `shape` (each request then needs one).
    pub fn with_states(mut self, shape: KdaShape, layers: usize) -> Self {
        self.states = StateSlots::new(shape, layers);
        self
    }

    /// The pool with DeepSeek-V4 caches of `shape`: their rows in a page group per cache kind ([`CachePages`],
    /// `page_size` rows a page), each request's token counts and compressor states in a state slot (each request
    /// then needs one).
    pub fn with_compressed_states(mut self, shape: CompressedShape) -> Self {
        self.cache_pages = Some(CachePages::new(&shape, self.shape.page_size, self.shape.pages));
        self.states = StateSlots::compressed(shape);
        self
    }

    /// DeepSeek-V4's cache pages (`None` for other models).
    pub fn cache_pages(&self) -> Option<&CachePages> {
        self.cache_pages.as_ref()
    }

    /// The state slots.
    pub fn state_slots(&self) -> &StateSlots {
        &self.states
    }

    /// Gives `request` a state slot holding `states` (one per stateful layer) with a new generation, stored as
    /// [`KvPool::keep_state`] says.
    pub fn store_states(&mut self, request: RequestId, mut states: Vec<LayerState>) -> Result<(), PoolError> {
        if !self.tables.contains_key(&request) {
            return Err(PoolError::Unknown(request));
        }
        states.iter_mut().for_each(|state| self.keep_state(state));
        self.page_rows(request, &mut states)?;
        let generation = self.next_generation;
        self.next_generation += 1;
        let mapping = self.states.store(request, generation, states);
        self.tables.get_mut(&request).ok_or(PoolError::Unknown(request))?.state = Some(mapping);
        self.peak_state_bytes = self.peak_state_bytes.max(self.states.held_bytes());
        Ok(())
    }

    /// A state as the pool stores it: a KDA state as vLLM does (convolution inputs in the model's dtype, BF16;
    /// recurrent state F32, [`crate::runtime::kda::KdaState::as_stored`]) in a BF16 or FP8 pool, exactly in an F32
    /// pool (the pool that checks decode against the full forward); a V4 cache as its layers stored it (FP8 for an
    /// FP8 pool: [`crate::arch::v4_kv_fp8`]).
    pub fn keep_state(&self, state: &mut LayerState) {
        if let (LayerState::Kda(state), false) = (state, self.dtype == KvDtype::F32) {
            state.as_stored();
        }
    }

    /// Moves stateful layer `index`'s state out of `request`'s slot (after [`KvPool::states_mut`]'s checks), for a
    /// step that gives it back with [`KvPool::restore_state`]; the slot fails the size check until then. A
    /// DeepSeek-V4 cache comes out with its rows gathered from the pages, after the layer's tables are checked.
    pub fn take_state(&mut self, request: RequestId, index: usize) -> Result<Option<LayerState>, PoolError> {
        let mut state = self.states_mut(request)?.get_mut(index).map(std::mem::take);
        if let (Some(LayerState::Compressed(cache)), Some(pages)) = (&mut state, &self.cache_pages) {
            if let Err(fault) = pages.gather(request, index, cache) {
                self.counters.faults_detected += 1;
                return Err(fault.into());
            }
        }
        Ok(state)
    }

    /// Gives back the state [`KvPool::take_state`] moved out, stored as [`KvPool::keep_state`] says; the slot must
    /// still be the request's (its tag's owner and generation). A DeepSeek-V4 cache's new rows go to the pages (the
    /// window's pages behind the window freed), the rest to the slot.
    pub fn restore_state(&mut self, request: RequestId, index: usize, mut state: LayerState) -> Result<(), PoolError> {
        self.keep_state(&mut state);
        if let (LayerState::Compressed(cache), Some(pages)) = (&mut state, &mut self.cache_pages) {
            pages.scatter(request, index, cache)?;
        }
        let mapping = self.tables.get(&request).ok_or(PoolError::Unknown(request))?.state;
        self.states.restore(request, mapping, index, state)?;
        self.peak_state_bytes = self.peak_state_bytes.max(self.states.held_bytes());
        Ok(())
    }

    /// Moves the rows of `states`' DeepSeek-V4 caches (layer `i` the `i`-th) into `request`'s pages.
    fn page_rows(&mut self, request: RequestId, states: &mut [LayerState]) -> Result<(), PoolError> {
        let Some(pages) = &mut self.cache_pages else { return Ok(()) };
        pages.release(request, false);
        for (layer, state) in states.iter_mut().enumerate() {
            if let LayerState::Compressed(cache) = state {
                pages.scatter(request, layer, cache)?;
            }
        }
        Ok(())
    }

    /// Most bytes the state slots held at once (KDA states as vLLM keeps them; DeepSeek-V4's compressor projections
    /// as the runtime does, f32) — memory beside the pages, which `--kv-pages` does not bound.
    pub fn peak_state_bytes(&self) -> usize {
        self.peak_state_bytes
    }

    /// `request`'s states (one per stateful layer), after checking its slot mapping (the tag and the sizes).
    pub fn states_mut(&mut self, request: RequestId) -> Result<&mut [LayerState], PoolError> {
        let table = self.tables.get(&request).ok_or(PoolError::Unknown(request))?;
        let (mapping, capacity) = (table.state, table.entries.len() * self.shape.page_size);
        if let Err(fault) = self.states.check(request, mapping, capacity) {
            self.counters.faults_detected += 1;
            return Err(fault.into());
        }
        match mapping {
            Some(mapping) => Ok(self.states.states_mut(mapping)),
            None => Ok(&mut []),
        }
    }
}
