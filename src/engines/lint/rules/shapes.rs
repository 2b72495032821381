//! The group-size rule: the INT4 group size must divide `hidden_size` and each tensor-parallel shard of
//! `moe_intermediate_size`; shards that are not a multiple of max(64, group) make Marlin pad.

use super::config::{group_size, GROUP_SIZES};
use crate::engines::lint::context::{Context, Stored};
use crate::engines::lint::report::{Finding, Outcome};
use crate::engines::Engine;

/// "use --group-size 64 or --tp 4": the settings that satisfy `fits(group, tp)`, nearest first; `otherwise`
/// when none does.
fn remedy(group: usize, tp: usize, fits: impl Fn(usize, usize) -> bool, otherwise: &str) -> String {
    let mut options = Vec::new();
    if let Some(g) = GROUP_SIZES.iter().rev().copied().find(|&g| g != group && fits(g, tp)) {
        options.push(format!("--group-size {g}"));
    }
    // Deployments use power-of-two tensor parallelism: tp/2, tp/4, …, 1.
    let smaller = std::iter::successors(Some(tp / 2), |t| (*t > 1).then_some(t / 2)).filter(|t| *t >= 1);
    if let Some(t) = smaller.into_iter().find(|&t| fits(group, t)) {
        options.push(format!("--tp {t}"));
    }
    match options.is_empty() {
        true => otherwise.into(),
        false => format!("use {}", options.join(" or ")),
    }
}

const NO_FIT: &str = "no group size of 32, 64 or 128 fits this model at this tp; choose another --tp";

pub fn group_size_tp(context: &Context, _: Engine) -> Outcome {
    let experts: Vec<&str> =
        context.routed_experts().into_iter().filter(|m| context.modules.get(m) == Some(&Stored::Int4)).collect();
    if experts.is_empty() {
        return Outcome::skipped("no INT4 routed experts");
    }
    // Both engines take one scale per row for the experts (`strategy == "channel"` gives one group: vLLM 0.32
    // compressed_tensors_moe_wna16.py, SGLang 0.5.23 compressed_tensors_wNa16_moe.py
    // `CompressedTensorsWNA16MoE.create_weights`, group size -1 for Marlin), which no tensor-parallel split can cross.
    let channel = super::config::int4_group_weights(context)
        .is_some_and(|(_, weights)| weights.get("strategy").and_then(serde_json::Value::as_str) == Some("channel"));
    if channel {
        return Outcome::skipped("strategy channel: one scale per row");
    }
    let Some(group) = group_size(context) else {
        return Outcome::from_findings(
            "",
            vec![Finding::failed(
                "quantization_config.config_groups.*.weights.group_size",
                "missing",
                "write the group size of the INT4 group (squeeze quantize does)",
            )],
        );
    };
    let (hidden, intermediate) =
        match (context.config_usize("hidden_size"), context.config_usize("moe_intermediate_size")) {
            (Ok(h), Ok(i)) => (h, i),
            (h, i) => return Outcome::from_findings("", [h.err(), i.err()].into_iter().flatten().collect()),
        };
    let tp = context.tp.max(1);
    let detail = format!("hidden {hidden}, moe_intermediate {intermediate} / tp {tp}, group {group}");
    let subject = format!("routed experts ({} projections)", experts.len());
    let fits = |g: usize, t: usize| {
        intermediate.is_multiple_of(t) && (intermediate / t).is_multiple_of(g) && hidden.is_multiple_of(g)
    };
    let mut findings = Vec::new();
    if !intermediate.is_multiple_of(tp) {
        findings.push(Finding::failed(
            "config.json `moe_intermediate_size`",
            format!("{intermediate} is not divisible by tp {tp}: the experts cannot be sharded"),
            remedy(group, tp, fits, NO_FIT),
        ));
        return Outcome::from_findings(detail, findings);
    }
    let shard = intermediate / tp;
    if !shard.is_multiple_of(group) {
        findings.push(Finding::failed(
            subject.clone(),
            format!(
                "moe_intermediate_size {intermediate} / tp {tp} = {shard} is not a multiple of group size {group}: \
                 the engine rejects the layer"
            ),
            remedy(group, tp, fits, NO_FIT),
        ));
    }
    if !hidden.is_multiple_of(group) {
        findings.push(Finding::failed(
            subject.clone(),
            format!("hidden_size {hidden} is not a multiple of group size {group}"),
            remedy(group, tp, fits, NO_FIT),
        ));
    }
    let marlin = group.max(64);
    if findings.is_empty() && !shard.is_multiple_of(marlin) {
        findings.push(Finding::warning(
            subject.clone(),
            format!(
                "moe_intermediate_size / tp = {shard} is not a multiple of max(64, group size) = {marlin}: Marlin \
                 pads the weights (it loads; slower, more memory)"
            ),
            remedy(
                group,
                tp,
                |g, t| fits(g, t) && (intermediate / t).is_multiple_of(g.max(64)),
                "none needed to load; a tp with (moe_intermediate_size / tp) % 64 == 0 avoids the padding",
            ),
        ));
    }
    if !hidden.is_multiple_of(128) {
        findings.push(Finding::warning(
            subject,
            format!("hidden_size {hidden} is not a multiple of 128: the Marlin MoE kernel does not take it"),
            "none for a real release (their hidden sizes are multiples of 128); tiny test models may differ",
        ));
    }
    Outcome::from_findings(detail, findings)
}
