//! The architectures the reference runtime runs — `DeepseekV3ForCausalLM` (Kimi K2), `GlmMoeDsaForCausalLM`
//! (GLM-5), `Glm4MoeForCausalLM` (GLM-4.5), `KimiLinearForCausalLM` (Kimi-Linear), GLM-5.3-Flash and
//! `DeepseekV4ForCausalLM` (compressed attention [`compressed_attention`], routers [`router`]), matching HF
//! transformers' float32 logits — one file per piece, each with its full-sequence forward and its decode step, on
//! the op surface of [`crate::runtime`]. A [`Layer`] is a token mixer (MLA [`mla`], GQA [`gqa`], KDA [`kda`],
//! V4's compressed attention) and an MLP/MoE ([`moe`]) on the residual stream. One [`Layer`] type serves both:
//! [`Model`] streams the layers through whole sequences (or through contexts run once and the continuations stepped
//! after them: [`continuations`]); [`paged::PagedModel`] keeps them resident for prompt prefill and the paged decode
//! step of `serve-test`.
//!
//! # Layer-streamed execution and memory
//! Weights are read one decoder layer at a time (mmap → dequantize to f32), every sequence of the batch advances
//! through that layer, then the layer is dropped; a reader thread ([`crate::load::layer_stream`]) reads layer
//! `i + 1` while layer `i` computes ([`run_layers`]); on a device an uploader thread copies `i + 1` to the GPU while
//! the reader goes on to `i + 2`. Routed experts are streamed further:
//! the experts hit by some token are read in batches of at most `EXPERT_BATCH_BYTES` (2 GiB, ~10 Kimi K2 experts; at
//! least one expert), a loader thread reading batch `b + 1` while the backend applies batch `b`
//! ([`crate::runtime::Backend::routed_experts`]: grouped W4A16 on the device for INT4 checkpoints), and each batch
//! is dropped after use. Peak memory is
//!
//! ```text
//! peak ≈ two layers' dequantized f32 weights without routed experts      (attention + router + shared/dense MLP;
//!                                                                          the one computing and the one loaded ahead;
//!                                                                          three on a device: one more being read
//!                                                                          while the next uploads)
//!      + 2 × one batch of routed experts: ≤ 2 × max(2 GiB, one expert)    (expert ≤ 3 · moe_intermediate · hidden · 5 B:
//!                                                                          f32 + packed INT4 + scales)
//!      + activations: tokens × hidden × 4 B × ~6  (+ MLA keys/values tokens × heads × (qk+v) × 4 B)
//!      + logits of one sequence: ctx × vocab × 4 B  (+ lm_head in f32: vocab × hidden × 4 B)
//! ```
//! where `tokens = sequences × ctx`, independent of the number of layers, so a 705 GiB model runs in the memory of
//! one layer. The checkpoint itself stays memory-mapped (page cache, not process memory).

pub mod causal_lm;
pub mod compressed_attention;
pub mod compressor;
pub mod context;
pub mod continuations;
pub mod embedding;
pub mod entry_indexer;
#[cfg(test)]
mod golden;
pub mod gqa;
pub mod hyper;
pub mod indexer;
pub mod kda;
pub mod layer;
pub mod mla;
pub mod moe;
pub mod mtp;
pub mod mtp_chain;
pub mod paged;
pub mod rope;
pub mod router;
pub mod tap;
pub mod v4_kv_fp8;

pub use causal_lm::{run_layers, DraftSink, ForwardStats, LayerHook, LayerStep, LogitsSink, Model};
pub use context::{LayerContext, LayerState, Residual};
pub use embedding::{embed, head_name};
pub use layer::Layer;
pub use moe::ExpertTimes;
pub use tap::{CachedKv, ExpertActivations, ExpertObserver, ExpertTap, KvFp8, KvObserver, KvSource, KvTap, LayerTap};
