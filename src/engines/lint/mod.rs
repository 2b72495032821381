//! The export linter: the engine load rules of docs/engines.md (vLLM, SGLang), checked on an abstract
//! description of an output so that `quantize` runs them on its plan before writing and `verify` on the files.

pub mod context;
pub mod engine;
pub mod fixes;
pub mod indexer_schedule;
pub mod output;
pub mod report;
pub mod rules;
pub mod written;

use super::Engine;

pub use engine::default_tp;
pub use fixes::{glm5_next_fixes, indexer_fixes, router_fixes, ConfigFix};
pub use output::{OutputDescription, TensorFacts, Values};
pub use report::{LintReport, RuleResult, Status};

/// Runs every rule for each engine on `output` at tensor-parallel size `tp`.
pub fn lint(output: &OutputDescription, engines: &[Engine], tp: usize) -> LintReport {
    let context = context::Context::new(output, tp);
    let mut rows = Vec::new();
    for rule in &rules::RULES {
        let outcomes = engines
            .iter()
            .map(|&engine| {
                let outcome = (rule.check)(&context, engine);
                let source = outcome.source.unwrap_or(rule.source(engine));
                (engine, outcome, source)
            })
            .collect();
        rows.extend(report::merge(rule.id, rule.title, outcomes));
    }
    LintReport::new(engines.to_vec(), tp, rows)
}

#[cfg(test)]
mod tests;
