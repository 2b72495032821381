//! A request's KDA states in and out of the pool: the slots made for a model's KDA layers, a prefilled request's
//! states stored under a new generation, a decode step's state moved out and back, every access after the slot's
//! tag and sizes are checked ([`super::states`] holds the slots themselves).

use super::{KvDtype, KvPool, PoolError, RequestId, StateSlots};
use crate::runtime::kda::{KdaShape, KdaState};

impl KvPool {
    /// The pool with state slots for a model's `layers` KDA layers of `shape` (each request then needs one).
    pub fn with_states(mut self, shape: KdaShape, layers: usize) -> Self {
        self.states = StateSlots::new(shape, layers);
        self
    }

    /// The state slots.
    pub fn state_slots(&self) -> &StateSlots {
        &self.states
    }

    /// Gives `request` a state slot holding `states` (one per KDA layer) with a new generation, stored as
    /// [`KvPool::keep_state`] says.
    pub fn store_states(&mut self, request: RequestId, mut states: Vec<KdaState>) -> Result<(), PoolError> {
        if !self.tables.contains_key(&request) {
            return Err(PoolError::Unknown(request));
        }
        states.iter_mut().for_each(|state| self.keep_state(state));
        let generation = self.next_generation;
        self.next_generation += 1;
        let mapping = self.states.store(request, generation, states);
        self.tables.get_mut(&request).ok_or(PoolError::Unknown(request))?.state = Some(mapping);
        Ok(())
    }

    /// A KDA state as the pool stores it: as vLLM does (convolution inputs in the model's dtype, BF16; recurrent
    /// state F32, [`KdaState::as_stored`]) in a BF16 or FP8 pool, exactly in an F32 pool (the
    /// pool that checks decode against the full forward).
    pub fn keep_state(&self, state: &mut KdaState) {
        if self.dtype != KvDtype::F32 {
            state.as_stored();
        }
    }

    /// Moves KDA layer `index`'s state out of `request`'s slot (after [`KvPool::states_mut`]'s checks), for a step
    /// that gives it back with [`KvPool::restore_state`]; the slot fails the size check until then.
    pub fn take_state(&mut self, request: RequestId, index: usize) -> Result<Option<KdaState>, PoolError> {
        Ok(self.states_mut(request)?.get_mut(index).map(std::mem::take))
    }

    /// Gives back the state [`KvPool::take_state`] moved out, stored as [`KvPool::keep_state`] says; the slot must
    /// still be the request's (its tag's owner and generation).
    pub fn restore_state(&mut self, request: RequestId, index: usize, mut state: KdaState) -> Result<(), PoolError> {
        self.keep_state(&mut state);
        let mapping = self.tables.get(&request).ok_or(PoolError::Unknown(request))?.state;
        self.states.restore(request, mapping, index, state).map_err(PoolError::from)
    }

    /// `request`'s KDA states (one per KDA layer), after checking its slot mapping (the tag and the sizes).
    pub fn states_mut(&mut self, request: RequestId) -> Result<&mut [KdaState], PoolError> {
        let mapping = self.tables.get(&request).ok_or(PoolError::Unknown(request))?.state;
        if let Err(fault) = self.states.check(request, mapping) {
            self.counters.faults_detected += 1;
            return Err(fault.into());
        }
        match mapping {
            Some(mapping) => Ok(self.states.states_mut(mapping)),
            None => Ok(&mut []),
        }
    }
}
