//! compressed-tensors module matching as vLLM and SGLang do it: a module name is a tensor name minus its
//! parameter suffix; an `ignore`/`targets` entry `re:P` matches like Python `re.match(P, name)` (anchored at the
//! start of the module name only, not the end); any other entry matches by exact equality; the target `Linear`
//! matches every linear layer.

use fancy_regex::Regex;

/// Parameter suffixes a module's tensors carry (checkpoint and compressed-tensors names).
pub const PARAMETER_SUFFIXES: [&str; 14] = [
    "weight",
    "weight_packed",
    "weight_scale",
    "weight_global_scale",
    "weight_shape",
    "weight_zero_point",
    "weight_g_idx",
    "weight_scale_inv",
    "bias",
    "input_scale",
    "input_global_scale",
    "k_scale",
    "v_scale",
    "e_score_correction_bias",
];

/// `model.layers.3.mlp.experts.7.down_proj.weight_packed` → (`model.layers.3.mlp.experts.7.down_proj`,
/// `weight_packed`); `None` when the last component is not a known parameter suffix.
pub fn module_name(tensor: &str) -> Option<(&str, &str)> {
    let (module, suffix) = tensor.rsplit_once('.')?;
    PARAMETER_SUFFIXES.contains(&suffix).then_some((module, suffix))
}

/// One `ignore` or `targets` entry.
#[derive(Debug, Clone)]
pub enum Pattern {
    /// A module name, matched exactly.
    Exact(String),
    /// `re:` entry: the regex anchored at the start, as Python's `re.match`.
    Regex { entry: String, regex: Regex },
    /// The layer-type target `Linear`.
    Linear,
}

impl Pattern {
    /// Parses an `ignore` entry (`Linear` is a module name there).
    pub fn ignore_entry(entry: &str) -> Result<Pattern, String> {
        match entry.strip_prefix("re:") {
            Some(pattern) => Regex::new(&format!("^(?:{pattern})"))
                .map(|regex| Pattern::Regex { entry: entry.to_string(), regex })
                .map_err(|error| format!("`{entry}` is not a valid regex: {error}")),
            None => Ok(Pattern::Exact(entry.to_string())),
        }
    }

    /// Parses a `targets` entry (`Linear` is the layer type there).
    pub fn target_entry(entry: &str) -> Result<Pattern, String> {
        if entry == "Linear" {
            Ok(Pattern::Linear)
        } else {
            Pattern::ignore_entry(entry)
        }
    }

    /// Whether this entry matches a linear module named `module`.
    pub fn matches(&self, module: &str) -> bool {
        match self {
            Pattern::Exact(name) => name == module,
            // A backtracking-limit error counts as no match (Python would not error, but such patterns are
            // pathological and the finding names the module either way).
            Pattern::Regex { regex, .. } => regex.is_match(module).unwrap_or(false),
            Pattern::Linear => true,
        }
    }

    /// The entry as written in the config.
    pub fn entry(&self) -> &str {
        match self {
            Pattern::Exact(name) => name,
            Pattern::Regex { entry, .. } => entry,
            Pattern::Linear => "Linear",
        }
    }
}

/// A parsed list of entries; entries that do not parse are kept as errors.
#[derive(Debug, Clone, Default)]
pub struct PatternList {
    pub patterns: Vec<Pattern>,
    pub errors: Vec<String>,
}

impl PatternList {
    pub fn ignore<'a>(entries: impl IntoIterator<Item = &'a str>) -> PatternList {
        Self::parse(entries, Pattern::ignore_entry)
    }

    pub fn targets<'a>(entries: impl IntoIterator<Item = &'a str>) -> PatternList {
        Self::parse(entries, Pattern::target_entry)
    }

    fn parse<'a>(
        entries: impl IntoIterator<Item = &'a str>,
        parse: fn(&str) -> Result<Pattern, String>,
    ) -> PatternList {
        let mut list = PatternList::default();
        for entry in entries {
            match parse(entry) {
                Ok(pattern) => list.patterns.push(pattern),
                Err(error) => list.errors.push(error),
            }
        }
        list
    }

    /// The first entry matching `module`.
    pub fn first_match(&self, module: &str) -> Option<&str> {
        self.patterns.iter().find(|pattern| pattern.matches(module)).map(Pattern::entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ignores(entry: &str, module: &str) -> bool {
        Pattern::ignore_entry(entry).unwrap().matches(module)
    }

    #[test]
    fn re_entries_match_from_the_start_like_python_re_match() {
        assert!(ignores("re:.*self_attn.*", "model.layers.0.self_attn.q_a_proj"));
        assert!(ignores("re:.*self_attn.*", "model.layers.0.self_attn.indexer.weights_proj"));
        assert!(!ignores("re:.*self_attn.*", "model.layers.0.mlp.experts.1.up_proj"));
        // Anchored at the start: a pattern that would be found by re.search does not match.
        assert!(!ignores("re:self_attn", "model.layers.0.self_attn.q_a_proj"));
        // Not anchored at the end (re.match, not re.fullmatch): a prefix is enough.
        assert!(ignores("re:model\\.layers\\.1", "model.layers.12.self_attn.o_proj"));
        assert!(ignores("re:.*mlp\\.(gate|up|gate_up|down)_proj.*", "model.layers.0.mlp.gate_proj"));
        assert!(!ignores("re:.*mlp\\.(gate|up|gate_up|down)_proj.*", "model.layers.3.mlp.experts.0.gate_proj"));
        assert!(ignores("re:.*mlp\\.gate$", "model.layers.3.mlp.gate"));
        assert!(!ignores("re:.*mlp\\.gate$", "model.layers.3.mlp.gate_proj"));
    }

    #[test]
    fn literal_entries_match_only_the_exact_module_name() {
        assert!(ignores("lm_head", "lm_head"));
        assert!(!ignores("lm_head", "model.layers.3.shared_head.head"));
        assert!(!ignores("lm_head", "lm_head.weight"));
        assert!(!ignores("lm_head", "xlm_head"));
        assert!(!ignores("model.layers.1.eh_proj", "model.layers.11.eh_proj"));
        // `Linear` is a module name in `ignore`, the layer type in `targets`.
        assert!(!ignores("Linear", "model.layers.0.self_attn.o_proj"));
        assert!(Pattern::target_entry("Linear").unwrap().matches("model.layers.0.self_attn.o_proj"));
    }

    #[test]
    fn bad_regexes_are_kept_as_errors_naming_the_entry() {
        let list = PatternList::ignore(["lm_head", "re:(unclosed"]);
        assert_eq!(list.patterns.len(), 1);
        assert!(list.errors[0].contains("re:(unclosed"), "{:?}", list.errors);
        assert_eq!(list.first_match("lm_head"), Some("lm_head"));
        assert_eq!(list.first_match("model.norm"), None);
    }

    #[test]
    fn module_names_drop_the_parameter_suffix() {
        assert_eq!(
            module_name("model.layers.3.mlp.experts.7.down_proj.weight_packed"),
            Some(("model.layers.3.mlp.experts.7.down_proj", "weight_packed"))
        );
        assert_eq!(module_name("lm_head.weight"), Some(("lm_head", "weight")));
        assert_eq!(module_name("model.layers.0.self_attn.k_scale"), Some(("model.layers.0.self_attn", "k_scale")));
        assert_eq!(module_name("model.layers.0.self_attn.something"), None);
    }
}
