//! The per-request state slots kept in the pool beside the pages: one slot per request holds its state of every
//! KDA (linear-attention) layer ([`KdaState`]: convolution inputs and recurrent state, a fixed size however long the
//! request), as vLLM keeps a request's mamba-style state in one slot of its state cache — or, for DeepSeek-V4, what
//! its cache of every layer holds besides the rows kept in pages ([`CompressedCache`] without rows: the token count
//! and the compressors' pending projections, as vLLM's compressor-state cache; [`super::CachePages`]). Each slot
//! carries a tag (owner request, allocation generation) that [`super::KvPool::verify`] checks against the request's
//! mapping together with the sizes of what the slot holds, so a swapped, freed, corrupted or mis-sized slot aborts
//! its request as a bad page mapping does.

use super::{IntegrityError, Mapping, RequestId};
use crate::runtime::compressed_cache::{CompressedCache, CompressedShape};
use crate::runtime::kda::{KdaShape, KdaState};

/// One layer's state in a request's slot.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum LayerState {
    Kda(KdaState),
    Compressed(Box<CompressedCache>),
    /// Moved out for a step ([`super::KvPool::take_state`]); fails the size check until given back.
    #[default]
    Taken,
}

/// What the slots of a pool hold per request.
#[derive(Debug, Clone, PartialEq)]
pub enum SlotKind {
    /// A state of `shape` for each of `layers` KDA layers.
    Kda(KdaShape, usize),
    /// A DeepSeek-V4 cache of each layer.
    Compressed(CompressedShape),
}

/// What a state slot says about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotTag {
    pub owner: RequestId,
    pub generation: u64,
}

/// One request's states of every stateful layer, and its tag.
#[derive(Debug, Clone, Default)]
pub(super) struct Slot {
    pub tag: Option<SlotTag>,
    pub states: Vec<LayerState>,
}

/// The slots of a pool: none for a model without KDA layers or V4 caches.
#[derive(Debug, Clone, Default)]
pub struct StateSlots {
    /// What each slot holds (`None`: the model keeps no state per request).
    pub(super) kind: Option<SlotKind>,
    pub(super) slots: Vec<Slot>,
    /// Slots free for reuse (LIFO).
    pub(super) free: Vec<usize>,
}

impl StateSlots {
    /// Slots for `layers` KDA layers of `shape`, made as requests arrive.
    pub fn new(shape: KdaShape, layers: usize) -> Self {
        Self { kind: Some(SlotKind::Kda(shape, layers)), slots: Vec::new(), free: Vec::new() }
    }

    /// Slots for DeepSeek-V4 caches of `shape`, made as requests arrive.
    pub fn compressed(shape: CompressedShape) -> Self {
        Self { kind: Some(SlotKind::Compressed(shape)), slots: Vec::new(), free: Vec::new() }
    }

    /// Whether the model has KDA layers (and so every request a slot).
    pub fn used(&self) -> bool {
        self.kind.is_some()
    }

    /// Bytes each request's slot holds as vLLM keeps it (F32 recurrent state, BF16 convolution inputs); a V4
    /// cache's pending projections as the runtime keeps them (f32) after `tokens` tokens.
    pub fn bytes_per_request(&self, tokens: usize) -> usize {
        match &self.kind {
            Some(SlotKind::Kda(shape, layers)) => {
                layers * (shape.recurrent_state_len() * 4 + shape.conv_state_len() * 2)
            }
            Some(SlotKind::Compressed(shape)) => shape.slot_bytes(tokens),
            None => 0,
        }
    }

    /// Bytes the occupied slots hold now ([`StateSlots::bytes_per_request`] at each slot's token count).
    pub fn held_bytes(&self) -> usize {
        self.slots
            .iter()
            .filter(|slot| slot.tag.is_some())
            .map(|slot| {
                let tokens = slot.states.iter().find_map(|state| match state {
                    LayerState::Compressed(cache) => Some(cache.tokens),
                    _ => None,
                });
                self.bytes_per_request(tokens.unwrap_or(0))
            })
            .sum()
    }

    /// Puts `states` in a free slot for `request` with a new `generation`; returns the mapping.
    pub(super) fn store(&mut self, request: RequestId, generation: u64, states: Vec<LayerState>) -> Mapping {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(Slot::default());
            self.slots.len() - 1
        });
        self.slots[slot] = Slot { tag: Some(SlotTag { owner: request, generation }), states };
        Mapping { page: slot as u32, generation }
    }

    /// Checks `request`'s mapping `mapping` to its slot: present when the model keeps states, in range, the
    /// slot's tag naming this request and generation, one state per KDA layer of the layer's sizes (a V4 cache per
    /// layer consistent with at most `capacity` tokens, the positions the request's pages reserve).
    pub(super) fn check(
        &self,
        request: RequestId,
        mapping: Option<Mapping>,
        capacity: usize,
    ) -> Result<(), IntegrityError> {
        let Some(kind) = &self.kind else { return Ok(()) };
        let Some(mapping) = mapping else { return Err(IntegrityError::NoState { request }) };
        let slot = mapping.page;
        let Some(Slot { tag, states }) = self.slots.get(slot as usize) else {
            return Err(IntegrityError::StateSlot { request, slot, problem: "is outside the state slots".into() });
        };
        let mismatch = |problem: String| IntegrityError::StateSlot { request, slot, problem };
        let Some(tag) = tag else { return Err(mismatch("is free (no tag)".into())) };
        if tag.owner != request {
            return Err(mismatch(format!("is tagged for request {}", tag.owner)));
        }
        if tag.generation != mapping.generation {
            return Err(mismatch(format!(
                "has generation {} in its tag but {} in the request's mapping",
                tag.generation, mapping.generation
            )));
        }
        match kind {
            SlotKind::Kda(shape, layers) => {
                let sizes = |state: &LayerState| match state {
                    LayerState::Kda(state) => Some((state.conv.len(), state.recurrent.len())),
                    _ => None,
                };
                let expected = Some((shape.conv_state_len(), shape.recurrent_state_len()));
                if states.len() != *layers || states.iter().any(|state| sizes(state) != expected) {
                    return Err(mismatch(format!(
                        "holds {} states of sizes {:?}; the model's {layers} KDA layers each need (conv, recurrent) = \
                         {expected:?}",
                        states.len(),
                        states.iter().map(sizes).collect::<Vec<_>>()
                    )));
                }
            }
            SlotKind::Compressed(shape) => {
                let caches: Option<Vec<&CompressedCache>> = states
                    .iter()
                    .map(|state| match state {
                        LayerState::Compressed(cache) => Some(&**cache),
                        _ => None,
                    })
                    .collect();
                let Some(caches) = caches else { return Err(mismatch("holds a state that is not a V4 cache".into())) };
                shape.check(&caches, capacity).map_err(mismatch)?;
            }
        }
        Ok(())
    }

    /// Puts `state` back as KDA layer `index` of `request`'s slot `mapping`, whose tag must still name the request
    /// and the mapping's generation.
    pub(super) fn restore(
        &mut self,
        request: RequestId,
        mapping: Option<Mapping>,
        index: usize,
        state: LayerState,
    ) -> Result<(), IntegrityError> {
        let Some(mapping) = mapping else { return Err(IntegrityError::NoState { request }) };
        let expected = Some(SlotTag { owner: request, generation: mapping.generation });
        match self.slots.get_mut(mapping.page as usize) {
            Some(slot) if slot.tag == expected && index < slot.states.len() => {
                slot.states[index] = state;
                Ok(())
            }
            _ => Err(IntegrityError::StateSlot {
                request,
                slot: mapping.page,
                problem: "changed while its state was being advanced".into(),
            }),
        }
    }

    /// The token count of each DeepSeek-V4 layer cache in slot `mapping` (checked by the caller; empty for KDA
    /// states).
    pub(super) fn layer_tokens(&self, mapping: Mapping) -> Vec<usize> {
        let states = self.slots.get(mapping.page as usize).map_or(&[][..], |slot| &slot.states[..]);
        states
            .iter()
            .filter_map(|state| match state {
                LayerState::Compressed(cache) => Some(cache.tokens),
                _ => None,
            })
            .collect()
    }

    /// The states of slot `mapping` (checked by the caller).
    pub(super) fn states_mut(&mut self, mapping: Mapping) -> &mut [LayerState] {
        &mut self.slots[mapping.page as usize].states
    }

    /// Frees `request`'s slot where its tag still names the request (a slot whose tag disagrees stays out of use);
    /// for an `aborted` request every slot whose tag names it, wherever it is mapped.
    pub(super) fn release(&mut self, request: RequestId, mapping: Option<Mapping>, aborted: bool) {
        let freed: Vec<usize> = if aborted {
            (0..self.slots.len()).filter(|&slot| self.slots[slot].tag.is_some_and(|t| t.owner == request)).collect()
        } else {
            let expected = mapping.map(|m| SlotTag { owner: request, generation: m.generation });
            mapping
                .map(|m| m.page as usize)
                .filter(|&slot| expected.is_some() && self.slots.get(slot).is_some_and(|s| s.tag == expected))
                .into_iter()
                .collect()
        };
        for slot in freed {
            self.slots[slot] = Slot::default();
            self.free.push(slot);
        }
    }
}
