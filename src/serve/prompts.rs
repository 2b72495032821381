//! Reads `--prompts FILE`: one prompt per line, or JSONL objects with a `prompt` field; blank lines are skipped.

use std::path::Path;

pub fn read_prompts(path: &Path) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    let mut prompts = Vec::new();
    for (number, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        if line.trim_start().starts_with('{') {
            let value: serde_json::Value = serde_json::from_str(line)
                .map_err(|e| format!("{}:{}: is not valid JSON: {e}", path.display(), number + 1))?;
            let prompt = value.get("prompt").and_then(|p| p.as_str()).ok_or_else(|| {
                format!("{}:{}: a JSONL line needs a string field `prompt`", path.display(), number + 1)
            })?;
            prompts.push(prompt.to_string());
        } else {
            prompts.push(line.to_string());
        }
    }
    if prompts.is_empty() {
        return Err(format!("{}: holds no prompts (empty file); write one prompt per line", path.display()));
    }
    Ok(prompts)
}
