//! The tensors each architecture stores, with their shapes and roles, derived from the config alone.
//! `synth` writes them, `quantize` checks checkpoints against them and `report` sizes checkpoints from them.

use super::config::{Attention, Layout, ModelConfig};
use super::tensor_spec::{TensorRole, TensorSpec};

fn push(specs: &mut Vec<TensorSpec>, name: String, shape: Vec<usize>, role: TensorRole) {
    specs.push(TensorSpec { name, shape, role });
}

/// Every tensor of the checkpoint described by `config`, in a stable order (embeddings, layers, head).
pub fn tensor_specs(config: &ModelConfig) -> Vec<TensorSpec> {
    use TensorRole::*;
    match &config.layout {
        Some(Layout::Glm5Next(_)) | None => {}
        Some(layout) => return layout_specs(layout, config),
    }
    let hidden = config.hidden_size;
    let mut specs = Vec::new();
    push(&mut specs, "model.embed_tokens.weight".into(), vec![config.vocab_size, hidden], Embedding);
    for layer in 0..config.stored_layers() {
        let prefix = format!("model.layers.{layer}");
        if layer >= config.num_hidden_layers {
            // Multi-token-prediction layer: its own embedding, projections and head around a decoder layer.
            push(&mut specs, format!("{prefix}.embed_tokens.weight"), vec![config.vocab_size, hidden], Embedding);
            push(&mut specs, format!("{prefix}.enorm.weight"), vec![hidden], Norm);
            push(&mut specs, format!("{prefix}.hnorm.weight"), vec![hidden], Norm);
            push(&mut specs, format!("{prefix}.eh_proj.weight"), vec![hidden, 2 * hidden], LinearBf16);
            push(&mut specs, format!("{prefix}.shared_head.norm.weight"), vec![hidden], Norm);
            push(&mut specs, format!("{prefix}.shared_head.head.weight"), vec![config.vocab_size, hidden], Embedding);
        }
        push(&mut specs, format!("{prefix}.input_layernorm.weight"), vec![hidden], Norm);
        match config.kda() {
            Some(kda) if config.is_kda_layer(layer) => {
                super::glm5_next::kda_specs(&kda, hidden, &format!("{prefix}.self_attn"), &mut specs)
            }
            _ => attention_specs(config, layer, &prefix, &mut specs),
        }
        push(&mut specs, format!("{prefix}.post_attention_layernorm.weight"), vec![hidden], Norm);
        mlp_specs(config, layer, &prefix, &mut specs);
        if let Some(hyper) = config.layer_hyper_connections(layer) {
            super::glm5_next::hyper_specs(&hyper, hidden, &prefix, &mut specs);
        }
    }
    push(&mut specs, "model.norm.weight".into(), vec![hidden], Norm);
    if !config.tie_word_embeddings {
        push(&mut specs, "lm_head.weight".into(), vec![config.vocab_size, hidden], Embedding);
    }
    specs
}

fn attention_specs(config: &ModelConfig, layer: usize, prefix: &str, specs: &mut Vec<TensorSpec>) {
    use TensorRole::*;
    let hidden = config.hidden_size;
    let heads = config.num_attention_heads;
    let attention = format!("{prefix}.self_attn");
    match &config.attention {
        Attention::Mla { q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim } => {
            let q_head = qk_nope_head_dim + qk_rope_head_dim;
            match q_lora_rank {
                Some(rank) => {
                    push(specs, format!("{attention}.q_a_proj.weight"), vec![*rank, hidden], Linear);
                    push(specs, format!("{attention}.q_a_layernorm.weight"), vec![*rank], Norm);
                    push(specs, format!("{attention}.q_b_proj.weight"), vec![heads * q_head, *rank], Linear);
                }
                None => push(specs, format!("{attention}.q_proj.weight"), vec![heads * q_head, hidden], Linear),
            }
            push(
                specs,
                format!("{attention}.kv_a_proj_with_mqa.weight"),
                vec![kv_lora_rank + qk_rope_head_dim, hidden],
                Linear,
            );
            push(specs, format!("{attention}.kv_a_layernorm.weight"), vec![*kv_lora_rank], Norm);
            push(
                specs,
                format!("{attention}.kv_b_proj.weight"),
                vec![heads * (qk_nope_head_dim + v_head_dim), *kv_lora_rank],
                Linear,
            );
            push(specs, format!("{attention}.o_proj.weight"), vec![hidden, heads * v_head_dim], Linear);
            // GLM-5.2's `shared` layers store no indexer: they reuse the previous full layer's selection.
            if let (Some(indexer), true) = (&config.indexer, config.runs_indexer(layer)) {
                let q_input = q_lora_rank.unwrap_or(hidden);
                let index = format!("{attention}.indexer");
                push(
                    specs,
                    format!("{index}.wq_b.weight"),
                    vec![indexer.index_n_heads * indexer.index_head_dim, q_input],
                    Linear,
                );
                push(specs, format!("{index}.wk.weight"), vec![indexer.index_head_dim, hidden], Linear);
                push(specs, format!("{index}.k_norm.weight"), vec![indexer.index_head_dim], Norm);
                push(specs, format!("{index}.k_norm.bias"), vec![indexer.index_head_dim], Norm);
                push(specs, format!("{index}.weights_proj.weight"), vec![indexer.index_n_heads, hidden], LinearBf16);
                if let Some(kpool) = indexer.kpool {
                    let dim = indexer.index_head_dim;
                    push(specs, format!("{index}.index_kpool_compress_ape"), vec![kpool.size, dim], Embedding);
                    push(specs, format!("{index}.index_kpool_compress_gate"), vec![dim, hidden], LinearBf16);
                }
            }
        }
        Attention::Gqa { num_key_value_heads, head_dim, attention_bias, use_qk_norm, .. } => {
            let q_out = heads * head_dim;
            let kv_out = num_key_value_heads * head_dim;
            for (projection, out) in [("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)] {
                push(specs, format!("{attention}.{projection}.weight"), vec![out, hidden], Linear);
                if *attention_bias {
                    push(specs, format!("{attention}.{projection}.bias"), vec![out], Bias);
                }
            }
            push(specs, format!("{attention}.o_proj.weight"), vec![hidden, q_out], Linear);
            if *use_qk_norm {
                push(specs, format!("{attention}.q_norm.weight"), vec![*head_dim], Norm);
                push(specs, format!("{attention}.k_norm.weight"), vec![*head_dim], Norm);
            }
        }
    }
}

fn mlp_specs(config: &ModelConfig, layer: usize, prefix: &str, specs: &mut Vec<TensorSpec>) {
    use TensorRole::*;
    let hidden = config.hidden_size;
    let gated = |specs: &mut Vec<TensorSpec>, module: String, inner: usize| {
        push(specs, format!("{module}.gate_proj.weight"), vec![inner, hidden], Linear);
        push(specs, format!("{module}.up_proj.weight"), vec![inner, hidden], Linear);
        push(specs, format!("{module}.down_proj.weight"), vec![hidden, inner], Linear);
    };
    if !config.runs_moe(layer) {
        gated(specs, format!("{prefix}.mlp"), config.intermediate_size);
        return;
    }
    push(specs, format!("{prefix}.mlp.gate.weight"), vec![config.n_routed_experts, hidden], LinearBf16);
    push(specs, format!("{prefix}.mlp.gate.e_score_correction_bias"), vec![config.n_routed_experts], RouterBias);
    for expert in 0..config.n_routed_experts {
        gated(specs, format!("{prefix}.mlp.experts.{expert}"), config.moe_intermediate_size);
    }
    if config.n_shared_experts > 0 {
        gated(specs, format!("{prefix}.mlp.shared_experts"), config.moe_intermediate_size * config.n_shared_experts);
    }
}

/// The tensors of an FP4-native generation's checkpoint, listed by its own module.
fn layout_specs(layout: &Layout, config: &ModelConfig) -> Vec<TensorSpec> {
    match layout {
        Layout::DeepseekV4(v4) => {
            let dims = super::deepseek_v4::Dims {
                hidden: config.hidden_size,
                heads: config.num_attention_heads,
                vocab: config.vocab_size,
                experts: config.n_routed_experts,
                top_k: config.num_experts_per_tok,
                moe_intermediate: config.moe_intermediate_size,
                shared_experts: config.n_shared_experts,
                num_hidden_layers: config.num_hidden_layers,
                stored_layers: config.stored_layers(),
            };
            super::deepseek_v4::tensor_specs(v4, &dims)
        }
        Layout::KimiLinear(kimi) => {
            let Attention::Mla { q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim } =
                config.attention
            else {
                unreachable!("a Kimi-Linear config is parsed with MLA")
            };
            let dims = super::kimi_linear::Dims {
                hidden: config.hidden_size,
                vocab: config.vocab_size,
                heads: config.num_attention_heads,
                q_lora_rank,
                kv_lora_rank,
                qk_nope_head_dim,
                qk_rope_head_dim,
                v_head_dim,
                experts: config.n_routed_experts,
                moe_intermediate: config.moe_intermediate_size,
                shared_experts: config.n_shared_experts,
                intermediate: config.intermediate_size,
                tie_word_embeddings: config.tie_word_embeddings,
            };
            super::kimi_linear::tensor_specs(kimi, &dims, &|layer| config.runs_moe(layer))
        }
        Layout::Glm5Next(_) => unreachable!("GLM-5.3-Flash's tensors are GLM-5's with its layers' additions"),
    }
}
