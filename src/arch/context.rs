//! What a decoder layer's forward takes besides its weights: the context of the run ([`LayerContext`]), and the
//! batch it advances ([`Residual`]: the residual stream, where each sequence lies, what it carries between layers).

use super::indexer::DsaMasks;
use crate::load::weights::WeightReader;
use crate::model::ModelConfig;
use crate::runtime::backend::Backend;
use crate::runtime::rope_table::RopeTable;
use crate::runtime::tensor::Tensor;
use crate::runtime::Spans;

/// What a layer's forward needs besides its weights.
pub struct LayerContext<'a> {
    pub backend: &'a dyn Backend,
    pub reader: &'a WeightReader<'a>,
    pub config: &'a ModelConfig,
    pub table: &'a RopeTable,
    pub mla_scale: f32,
}

/// A batch of sequences as it passes through the layers: its residual stream `[tokens, hidden]` (advanced in place
/// by each layer), where each sequence lies in it, and what it carries from one layer to the next.
pub struct Residual<'a> {
    pub hidden: &'a mut Tensor,
    pub spans: &'a Spans,
    pub state: &'a mut LayerState,
}

/// What a batch of sequences carries from one layer to the next besides its residual stream.
#[derive(Default)]
pub struct LayerState {
    /// The DSA top-k of the last layer with an indexer (reused by the `shared` layers after it).
    pub selection: Option<DsaMasks>,
    /// Router and DSA top-k decisions within a near-tie margin so far.
    pub near_ties: usize,
    /// The token id of each row of the residual stream (DeepSeek-V4's hash-routed layers pick experts by it); empty
    /// where the caller has none to give.
    pub tokens: Vec<u32>,
}
