//! DeepSeek-V4's MoE routers (transformers 5.24 `DeepseekV4TopKRouter`, `DeepseekV4HashRouter`): each expert's
//! score is `sqrt(softplus(logit))` of the gate's logits; a learned router picks the top-k of score + `ffn.gate.bias`
//! (the bias for selection only), a hash router (the first `num_hash_layers` layers) takes the experts its frozen
//! table `ffn.gate.tid2eid[token]` names. Either way the chosen experts' scores, normalized to sum 1, times
//! `routed_scaling_factor` weight them. On the host (the gate's projection on the backend).

use crate::io::Dtype;
use crate::load::weights::WeightReader;
use crate::model::ModelConfig;
use crate::runtime::backend::RoutingShape;
use crate::runtime::cpu::routing::{top_k_of, weights_of};
use crate::runtime::RuntimeError;

/// Per token, its `(expert, weight)` choices in rank order.
pub type TokenRoutes = Vec<Vec<(usize, f32)>>;

/// How a V4 layer picks its experts.
pub enum V4Selection {
    /// Top-k of `score + bias` (`ffn.gate.bias` `[experts]`).
    Learned { bias: Vec<f32> },
    /// `tid2eid` `[vocab, top_k]`: the experts of each token id.
    Hash { table: Vec<usize> },
}

/// torch's `softplus` (β 1, threshold 20: the identity above it).
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

impl V4Selection {
    /// Layer `layer`'s selection from the gate of MoE block `block` (`layers.N.ffn`): its hash table (checked: one
    /// row per token id, expert ids in range) for a hash layer, else its bias.
    pub fn load(reader: &WeightReader, config: &ModelConfig, block: &str, layer: usize) -> Result<Self, RuntimeError> {
        let experts = config.n_routed_experts;
        let hash_layers = config.deepseek_v4().map_or(0, |v4| v4.num_hash_layers);
        if layer >= hash_layers {
            return Ok(Self::Learned { bias: reader.vector(&format!("{block}.gate.bias"), experts)? });
        }
        let name = format!("{block}.gate.tid2eid");
        let Some(tensor) = reader.checkpoint().get(&name) else {
            return Err(RuntimeError::Input(format!(
                "{name}: missing, while num_hash_layers is {hash_layers}: a hash-routed layer picks its experts from \
                 this table; the checkpoint is incomplete or config.json's num_hash_layers is wrong"
            )));
        };
        let (vocab, top_k) = (config.vocab_size, config.num_experts_per_tok);
        let ids: Vec<i64> = match tensor.dtype {
            Dtype::I32 => {
                tensor.bytes.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64).collect()
            }
            Dtype::I64 => {
                tensor.bytes.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap_or_default())).collect()
            }
            other => {
                return Err(RuntimeError::Input(format!(
                    "{name}: has dtype {other:?}; a hash table holds I32 or I64 expert ids"
                )))
            }
        };
        if tensor.shape != [vocab, top_k] {
            return Err(RuntimeError::Input(format!(
                "{name}: has shape {:?} but config.json implies [{vocab}, {top_k}] (vocab_size, num_experts_per_tok); \
                 the config does not belong to these weights",
                tensor.shape
            )));
        }
        let table = ids
            .iter()
            .enumerate()
            .map(|(index, &id)| match usize::try_from(id) {
                Ok(id) if id < experts => Ok(id),
                _ => Err(RuntimeError::Input(format!(
                    "{name}: token id {} maps to expert {id}, outside the {experts} routed experts (n_routed_experts); \
                     the table does not belong to this model",
                    index / top_k
                ))),
            })
            .collect::<Result<_, _>>()?;
        Ok(Self::Hash { table })
    }

    /// The routes of rows `logits` (`[tokens, experts]`, the gate's) of tokens `ids` (the token id of each row, for
    /// a hash layer), and the number of near-ties at a learned router's top-k boundary.
    pub fn route(
        &self,
        logits: &[f32],
        ids: &[u32],
        shape: &RoutingShape,
    ) -> Result<(TokenRoutes, usize), RuntimeError> {
        let rows = logits.len() / shape.experts.max(1);
        if matches!(self, Self::Hash { .. }) && ids.len() != rows {
            return Err(RuntimeError::Input(format!(
                "a hash-routed layer needs the token id of each of its {rows} rows, got {}",
                ids.len()
            )));
        }
        let mut near_ties = 0;
        let routes = logits
            .chunks_exact(shape.experts)
            .enumerate()
            .map(|(row, logits)| {
                let scores: Vec<f32> = logits.iter().map(|&logit| softplus(logit).sqrt()).collect();
                let chosen = match self {
                    Self::Learned { bias } => {
                        let choice: Vec<f32> = scores.iter().zip(bias).map(|(s, b)| s + b).collect();
                        let (chosen, near_tie) = top_k_of(&choice, shape.top_k);
                        near_ties += usize::from(near_tie);
                        chosen
                    }
                    Self::Hash { table } => table[ids[row] as usize * shape.top_k..][..shape.top_k].to_vec(),
                };
                let weights = weights_of(&scores, &chosen, shape);
                chosen.iter().copied().zip(weights).collect()
            })
            .collect();
        Ok((routes, near_ties))
    }
}
