//! One serving node's GPU memory budget: weights per GPU, the KV pool left beside them, the KV capacity in tokens
//! and the concurrent requests of a given length it holds.

use super::gpu::GpuMemory;
use super::kv;
use crate::format::kv_scales::KvDtype;
use crate::model::ModelConfig;

/// How a node is laid out and how much of each GPU the engine may use.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Layout {
    /// GPUs in the node (one serving deployment; may span machines).
    pub gpus: usize,
    /// Tensor-parallel size: weights are split `tp` ways; `gpus / tp` replicas serve side by side.
    pub tp: usize,
    /// Data-parallel attention (SGLang `--enable-dp-attention`, dp = tp): each rank attends to its own requests.
    pub dp_attention: bool,
    pub gpu_memory: GpuMemory,
    /// Share of GPU memory for weights and KV pool (SGLang `--mem-fraction-static`).
    pub mem_fraction: f64,
    /// Bytes per GPU held back inside that share (CUDA context, communication buffers).
    pub reserve_bytes: u64,
    /// Tokens per request (prompt plus output) for the concurrency figure.
    pub context: u64,
    /// A KV pool per GPU the user measured; replaces the computed one and skips the fit check.
    pub kv_pool_bytes: Option<u64>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum LayoutError {
    #[error("--tp {tp} must divide --gpus {gpus} (a node runs gpus/tp replicas)")]
    TpDoesNotDivide { tp: usize, gpus: usize },
    #[error("--{0} must be positive")]
    Zero(&'static str),
    #[error("--mem-fraction {0} must be in (0, 1]")]
    Fraction(f64),
}

impl Layout {
    pub fn check(&self) -> Result<(), LayoutError> {
        if self.gpus == 0 {
            return Err(LayoutError::Zero("gpus"));
        }
        if self.tp == 0 {
            return Err(LayoutError::Zero("tp"));
        }
        if self.context == 0 {
            return Err(LayoutError::Zero("context"));
        }
        if !self.gpus.is_multiple_of(self.tp) {
            return Err(LayoutError::TpDoesNotDivide { tp: self.tp, gpus: self.gpus });
        }
        let fraction_valid = self.mem_fraction > 0.0 && self.mem_fraction <= 1.0;
        if !fraction_valid {
            return Err(LayoutError::Fraction(self.mem_fraction));
        }
        Ok(())
    }

    /// Engine replicas in the node.
    pub fn replicas(&self) -> usize {
        self.gpus / self.tp
    }

    /// Data-parallel attention groups per replica: `tp` with DP attention, else 1.
    pub fn attention_dp(&self) -> usize {
        if self.dp_attention {
            self.tp
        } else {
            1
        }
    }

    /// Tensor-parallel size of attention: `tp / attention_dp`.
    pub fn attention_tp(&self) -> usize {
        self.tp / self.attention_dp()
    }

    /// Bytes per GPU for weights, reserve and KV pool: `gpu_memory × mem_fraction`, rounded down.
    pub fn usable_bytes_per_gpu(&self) -> u64 {
        (self.gpu_memory.bytes as f64 * self.mem_fraction).floor() as u64
    }
}

/// The budget of one node.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NodeBudget {
    /// What the weights are: `fp8 source`, a recipe name.
    pub weights: String,
    pub weight_bytes: u64,
    /// `weight_bytes / tp`, rounded up.
    pub weight_bytes_per_gpu: u64,
    pub kv_dtype: KvDtype,
    pub kv_bytes_per_token_per_layer: u64,
    /// Per GPU; see `kv::per_token`.
    pub kv_bytes_per_token: u64,
    pub kv_pool_bytes_per_gpu: u64,
    pub kv_capacity_tokens_per_gpu: u64,
    /// Tokens the whole node holds: per GPU × attention DP groups × replicas.
    pub kv_capacity_tokens: u64,
    /// Requests of `context` tokens the node holds at once.
    pub max_concurrency: u64,
    pub context: u64,
}

/// Weights that do not fit beside the reserve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortfall {
    pub weight_bytes_per_gpu: u64,
    pub available_bytes_per_gpu: u64,
    /// Bytes per GPU missing.
    pub bytes: u64,
}

/// Sizes one node; `Err` when its weights and the reserve exceed the usable memory.
pub fn node(
    config: &ModelConfig,
    layout: &Layout,
    weights: &str,
    weight_bytes: u64,
    kv_dtype: KvDtype,
) -> Result<NodeBudget, Shortfall> {
    let weight_bytes_per_gpu = weight_bytes.div_ceil(layout.tp as u64);
    let kv = kv::per_token(config, kv_dtype, layout.attention_tp());
    let kv_pool_bytes_per_gpu = match layout.kv_pool_bytes {
        Some(pool) => pool,
        None => {
            let available = layout.usable_bytes_per_gpu().saturating_sub(layout.reserve_bytes);
            if weight_bytes_per_gpu >= available {
                return Err(Shortfall {
                    weight_bytes_per_gpu,
                    available_bytes_per_gpu: available,
                    bytes: weight_bytes_per_gpu - available,
                });
            }
            available - weight_bytes_per_gpu
        }
    };
    let groups = (layout.attention_dp() * layout.replicas()) as u64;
    let kv_capacity_tokens_per_gpu = kv_pool_bytes_per_gpu / kv.bytes_per_token.max(1);
    // A request also holds its fixed state (KDA's recurrent state, DeepSeek-V4's sliding window) beside its tokens.
    let request_bytes = kv.bytes_per_token * layout.context + kv.state_bytes_per_request;
    Ok(NodeBudget {
        weights: weights.to_string(),
        weight_bytes,
        weight_bytes_per_gpu,
        kv_dtype,
        kv_bytes_per_token_per_layer: kv.bytes_per_layer,
        kv_bytes_per_token: kv.bytes_per_token,
        kv_pool_bytes_per_gpu,
        kv_capacity_tokens_per_gpu,
        kv_capacity_tokens: kv_capacity_tokens_per_gpu * groups,
        max_concurrency: match kv.state_bytes_per_request {
            0 => kv_capacity_tokens_per_gpu / layout.context * groups,
            _ => kv_pool_bytes_per_gpu / request_bytes.max(1) * groups,
        },
        context: layout.context,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kimi() -> ModelConfig {
        let json: serde_json::Value =
            serde_json::from_str(crate::model::presets::config_text("kimi-k2").unwrap()).unwrap();
        ModelConfig::from_json(&json).unwrap()
    }

    fn layout() -> Layout {
        Layout {
            gpus: 8,
            tp: 8,
            dp_attention: false,
            gpu_memory: GpuMemory { name: "test".into(), bytes: 100_000_000_000 },
            mem_fraction: 0.9,
            reserve_bytes: 2_000_000_000,
            context: 21_400,
            kv_pool_bytes: None,
        }
    }

    #[test]
    fn pool_is_usable_memory_less_weights_and_reserve() {
        // 8 × 40 GB of weights: 90 − 2 − 40 = 48 GB of pool per GPU.
        let budget = node(&kimi(), &layout(), "w", 320_000_000_000, KvDtype::Bf16).unwrap();
        assert_eq!(budget.weight_bytes_per_gpu, 40_000_000_000);
        assert_eq!(budget.kv_pool_bytes_per_gpu, 48_000_000_000);
        assert_eq!(budget.kv_capacity_tokens_per_gpu, 48_000_000_000 / 70_272);
        assert_eq!(budget.kv_capacity_tokens, budget.kv_capacity_tokens_per_gpu, "MLA rows are replicated across TP");
    }

    #[test]
    fn fp8_doubles_capacity_and_concurrency_for_the_same_pool() {
        let fixed = Layout { kv_pool_bytes: Some(48_200_000_000), ..layout() };
        let bf16 = node(&kimi(), &fixed, "w", 1, KvDtype::Bf16).unwrap();
        let fp8 = node(&kimi(), &fixed, "w", 1, KvDtype::Fp8).unwrap();
        assert_eq!(bf16.kv_capacity_tokens, 685_906);
        assert_eq!(fp8.kv_capacity_tokens, 1_371_812);
        assert_eq!(fp8.kv_capacity_tokens, 2 * bf16.kv_capacity_tokens);
        assert_eq!((bf16.max_concurrency, fp8.max_concurrency), (32, 64));
    }

    #[test]
    fn dp_attention_and_replicas_multiply_node_capacity() {
        let dp = Layout { dp_attention: true, kv_pool_bytes: Some(70_272 * 1000), context: 100, ..layout() };
        let budget = node(&kimi(), &dp, "w", 1, KvDtype::Bf16).unwrap();
        assert_eq!(budget.kv_capacity_tokens_per_gpu, 1000);
        assert_eq!(budget.kv_capacity_tokens, 8000);
        assert_eq!(budget.max_concurrency, 80);
        let replicas = Layout { tp: 4, kv_pool_bytes: Some(70_272 * 1000), context: 100, ..layout() };
        let budget = node(&kimi(), &replicas, "w", 1, KvDtype::Bf16).unwrap();
        assert_eq!(budget.kv_capacity_tokens, 2000);
        assert_eq!(budget.max_concurrency, 20);
    }

    #[test]
    fn weights_that_do_not_fit_report_the_shortfall() {
        let shortfall = node(&kimi(), &layout(), "w", 8 * 90_000_000_000, KvDtype::Bf16).unwrap_err();
        assert_eq!(shortfall.available_bytes_per_gpu, 88_000_000_000);
        assert_eq!(shortfall.bytes, 2_000_000_000);
    }

    #[test]
    fn layout_checks() {
        assert_eq!(Layout { tp: 3, ..layout() }.check(), Err(LayoutError::TpDoesNotDivide { tp: 3, gpus: 8 }));
        assert_eq!(Layout { mem_fraction: 1.5, ..layout() }.check(), Err(LayoutError::Fraction(1.5)));
        assert_eq!(Layout { context: 0, ..layout() }.check(), Err(LayoutError::Zero("context")));
        assert!(layout().check().is_ok());
    }
}
