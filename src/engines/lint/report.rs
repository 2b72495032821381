//! Rule results and the lint report (one serde struct): per rule and engine a status, its source and the
//! findings with the offending module/tensor and the remedy; engines with identical results share one row.

use serde::Serialize;

use crate::engines::Engine;

/// Most findings kept per rule; the rest are counted in `findings_omitted`.
pub const MAX_FINDINGS: usize = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Passed,
    /// Not applicable to this output (no MTP layer, no KV scales, nothing quantized).
    Skipped,
    /// The engine loads it, with a cost or a caveat.
    Warning,
    /// The engine refuses it or loads it wrong.
    Failed,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Passed => "passed",
            Status::Skipped => "skipped",
            Status::Warning => "warning",
            Status::Failed => "failed",
        }
    }
}

/// One offending module, tensor or config key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub status: Status,
    /// The module, tensor or config key.
    pub subject: String,
    pub problem: String,
    /// What to do about it.
    pub remedy: String,
}

impl Finding {
    pub fn failed(subject: impl Into<String>, problem: impl Into<String>, remedy: impl Into<String>) -> Self {
        Self { status: Status::Failed, subject: subject.into(), problem: problem.into(), remedy: remedy.into() }
    }

    pub fn warning(subject: impl Into<String>, problem: impl Into<String>, remedy: impl Into<String>) -> Self {
        Self { status: Status::Warning, subject: subject.into(), problem: problem.into(), remedy: remedy.into() }
    }
}

/// What one rule concluded for one engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub status: Status,
    pub detail: String,
    pub findings: Vec<Finding>,
    /// Overrides the rule's source for this outcome (a finding read in another file).
    pub source: Option<&'static str>,
}

impl Outcome {
    /// Status from the findings: failed if any failed, warning if any warned, else passed.
    pub fn from_findings(detail: impl Into<String>, findings: Vec<Finding>) -> Self {
        let status = findings.iter().map(|f| f.status).max().unwrap_or(Status::Passed);
        Self { status, detail: detail.into(), findings, source: None }
    }

    pub fn passed(detail: impl Into<String>) -> Self {
        Self::from_findings(detail, Vec::new())
    }

    pub fn skipped(detail: impl Into<String>) -> Self {
        Self { status: Status::Skipped, detail: detail.into(), findings: Vec::new(), source: None }
    }

    pub fn with_source(mut self, source: &'static str) -> Self {
        self.source = Some(source);
        self
    }
}

/// One row of the report: a rule's result for one or more engines.
#[derive(Debug, Clone, Serialize)]
pub struct RuleResult {
    pub rule: &'static str,
    pub title: &'static str,
    pub engines: Vec<Engine>,
    pub status: Status,
    /// Where the rule was read (file in vLLM/SGLang; docs/engines.md).
    pub source: String,
    pub detail: String,
    pub findings: Vec<Finding>,
    pub findings_omitted: usize,
}

/// The engine load rules checked on one output.
#[derive(Debug, Clone, Serialize)]
pub struct LintReport {
    pub engines: Vec<Engine>,
    pub tp: usize,
    pub passed: bool,
    pub failed: usize,
    pub warnings: usize,
    pub rules: Vec<RuleResult>,
}

impl LintReport {
    pub fn new(engines: Vec<Engine>, tp: usize, rules: Vec<RuleResult>) -> Self {
        let failed = rules.iter().filter(|r| r.status == Status::Failed).count();
        let warnings = rules.iter().filter(|r| r.status == Status::Warning).count();
        Self { engines, tp, passed: failed == 0, failed, warnings, rules }
    }

    pub fn failures(&self) -> impl Iterator<Item = &RuleResult> {
        self.rules.iter().filter(|r| r.status == Status::Failed)
    }

    pub fn warnings(&self) -> impl Iterator<Item = &RuleResult> {
        self.rules.iter().filter(|r| r.status == Status::Warning)
    }
}

impl RuleResult {
    /// The engines as `vllm, sglang`.
    pub fn engine_list(&self) -> String {
        self.engines.iter().map(|e| e.name()).collect::<Vec<_>>().join(", ")
    }

    /// One line per finding: `subject: problem; remedy`, plus a count of omitted ones.
    pub fn finding_lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .findings
            .iter()
            .map(|f| format!("{} {}: {}; {}", f.status.name(), f.subject, f.problem, f.remedy))
            .collect();
        if self.findings_omitted > 0 {
            lines.push(format!("… and {} more like these", self.findings_omitted));
        }
        lines
    }
}

/// Merges per-engine outcomes of one rule: one row when all engines agree, else one row per engine.
pub fn merge(
    rule: &'static str,
    title: &'static str,
    outcomes: Vec<(Engine, Outcome, &'static str)>,
) -> Vec<RuleResult> {
    let mut rows: Vec<(Vec<Engine>, Outcome, Vec<&'static str>)> = Vec::new();
    for (engine, outcome, source) in outcomes {
        match rows.iter_mut().find(|(_, existing, _)| *existing == outcome) {
            Some((engines, _, sources)) => {
                engines.push(engine);
                if !sources.contains(&source) {
                    sources.push(source);
                }
            }
            None => rows.push((vec![engine], outcome, vec![source])),
        }
    }
    rows.into_iter()
        .map(|(engines, mut outcome, sources)| {
            let omitted = outcome.findings.len().saturating_sub(MAX_FINDINGS);
            outcome.findings.truncate(MAX_FINDINGS);
            RuleResult {
                rule,
                title,
                engines,
                status: outcome.status,
                source: sources.join("; "),
                detail: outcome.detail,
                findings: outcome.findings,
                findings_omitted: omitted,
            }
        })
        .collect()
}
