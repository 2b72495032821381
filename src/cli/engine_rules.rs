//! Printing engine load rule results: the rule table (left-aligned: its sources are long) with findings on stdout, warnings and config fixes as
//! notes on stderr.

use crate::engines::lint::{ConfigFix, LintReport, Status};

/// The `--tp` value parser: a positive integer.
pub fn parse_tp(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(tp) if tp > 0 => Ok(tp),
        _ => Err(format!("`{text}` is not a positive integer (tensor-parallel size, e.g. 8)")),
    }
}

/// The rule table and, under it, every finding with its remedy (stdout).
pub fn print_rules(report: &LintReport) {
    let engines = report.engines.iter().map(|e| e.name()).collect::<Vec<_>>().join(", ");
    println!("engine load rules ({engines}; tp {}):", report.tp);
    let width = |cells: &mut dyn Iterator<Item = usize>| cells.max().unwrap_or(0);
    let rule_width = width(&mut report.rules.iter().map(|r| r.rule.len())).max(4);
    let engine_width = width(&mut report.rules.iter().map(|r| r.engine_list().len())).max(7);
    println!("{:<rule_width$}  {:<engine_width$}  {:<7}  detail (source)", "rule", "engines", "status");
    for rule in &report.rules {
        println!(
            "{:<rule_width$}  {:<engine_width$}  {:<7}  {} ({})",
            rule.rule,
            rule.engine_list(),
            rule.status.name(),
            rule.detail,
            rule.source
        );
    }
    for rule in report.rules.iter().filter(|r| matches!(r.status, Status::Failed | Status::Warning)) {
        for line in rule.finding_lines() {
            println!("{} [{}]: {line}", rule.rule, rule.engine_list());
        }
    }
    if report.passed {
        println!("engine rules: passed ({} warning(s))", report.warnings);
    } else {
        println!("engine rules: FAILED ({} rule(s) failed, {} warning(s))", report.failed, report.warnings);
    }
}

/// Warnings of rules that still load (stderr).
pub fn print_warnings(report: &LintReport) {
    for rule in report.warnings() {
        for line in rule.finding_lines() {
            eprintln!("warning: engine rule `{}` [{}] ({}): {line}", rule.rule, rule.engine_list(), rule.source);
        }
    }
}

/// Keys added to the output's config.json (stderr).
pub fn print_fixes(fixes: &[ConfigFix], dry_run: bool) {
    let verb = if dry_run { "would add" } else { "added" };
    for fix in fixes {
        eprintln!("note: {verb} \"{}\": {} to the output config.json ({})", fix.key, fix.value, fix.reason);
    }
}
