//! The engine load rules run on a plan before anything is written: the output the plan implies (its config with
//! the safe fixes applied, its tensors) goes through the same linter `verify --engine` uses on written files.

use serde_json::Value;

use crate::engines::lint::{self, ConfigFix, LintReport, OutputDescription, TensorFacts, Values};

use crate::plan::Plan;

/// The output `config.json`: the source config with `quantization_config` replaced where the source keeps it
/// (inside a wrapper's `text_config` for Kimi K2.6), and the safe fixes added (to the text model's keys).
pub fn output_config(source_config: &Value, quantization_config: Value, plan: &Plan) -> (Value, Vec<ConfigFix>) {
    let mut config = source_config.clone();
    match crate::io::composite::quantization_config_mut(&mut config) {
        Some(slot) => *slot = quantization_config,
        None => {
            if let Some(object) = config.as_object_mut() {
                object.insert("quantization_config".into(), quantization_config);
            }
        }
    }
    let names = plan.items.iter().flat_map(|item| item.outputs.iter().map(|t| t.name.as_str()));
    // The fixes go where the engines' text model reads its keys: a wrapper's `text_config` (GLM-5.3-Flash).
    let text = match config.get_mut("text_config") {
        Some(text) if text.is_object() => text,
        _ => &mut config,
    };
    let mut fixes = lint::router_fixes(text, names);
    fixes.extend(lint::indexer_fixes(text));
    fixes.extend(lint::glm5_next_fixes(text));
    (config, fixes)
}

/// What the rules see of a planned output: every output tensor's name, dtype and shape; `weight_shape` values
/// are known from the source shape, other values only once written.
pub fn planned_output(plan: &Plan, config: Option<&Value>) -> OutputDescription {
    let mut tensors = Vec::new();
    for item in &plan.items {
        for output in &item.outputs {
            let values = output
                .name
                .ends_with(".weight_shape")
                .then(|| Values::Ints(item.source.shape.iter().map(|&d| d as i64).collect()));
            tensors.push(TensorFacts {
                name: output.name.clone(),
                dtype: output.dtype,
                shape: output.shape.clone(),
                values,
            });
        }
    }
    OutputDescription { config: config.cloned().unwrap_or(Value::Null), tensors }
}

/// The refusal when a rule fails: each failed rule with its engines, source, first findings and remedies.
pub fn refusal(report: &LintReport) -> String {
    let mut text = String::from("the output would not load in the engines; nothing was written:");
    for rule in report.failures() {
        text.push_str(&format!("\n  rule `{}` failed for {} ({}):", rule.rule, rule.engine_list(), rule.source));
        for line in rule.finding_lines().into_iter().filter(|l| !l.starts_with("warning")).take(3) {
            text.push_str(&format!("\n    {line}"));
        }
    }
    text.push_str("\n  (--dry-run lists every rule; --engine none skips these checks)");
    text
}
