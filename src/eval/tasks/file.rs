//! The task file `eval --task FILE` reads: JSON Lines, one item per line, grouped into tasks by their `task` field
//! (in order of first appearance). A multiple-choice item has `context`, `choices` (at least two non-empty
//! strings) and `gold` (the index of the right one); a generation item has `context` and `target` (the answer
//! exact match compares with), optionally `until` (stop sequences, default `["\n\n"]`), `regex` (the answer is its
//! first match in the completion, the first non-empty group if it has groups, stripped; `[invalid]` without a
//! match — lm-evaluation-harness's regex filter) and `max_tokens` (default 256). An item with `"fewshot": true` is
//! not scored: the first `--num-fewshot` of its task are the examples every scored item's prompt starts with.
//! Blank lines are skipped. Every problem is an error naming the file, the line and the field.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// lm-evaluation-harness's `max_gen_toks` default.
pub const DEFAULT_MAX_TOKENS: usize = 256;

/// A task file, read and checked.
#[derive(Debug, Clone)]
pub struct TaskFile {
    pub path: PathBuf,
    pub tasks: Vec<Task>,
}

/// One task: its scored items and its few-shot examples, all of one kind.
#[derive(Debug, Clone)]
pub struct Task {
    pub name: String,
    pub items: Vec<Item>,
    pub fewshot: Vec<Item>,
}

impl Task {
    pub fn is_generation(&self) -> bool {
        matches!(self.items.first().or(self.fewshot.first()).map(|i| &i.answer), Some(Answer::Generate(_)))
    }
}

/// One line of the file.
#[derive(Debug, Clone)]
pub struct Item {
    /// 1-based line number in the file.
    pub line: usize,
    pub context: String,
    pub answer: Answer,
}

/// What an item is scored on.
#[derive(Debug, Clone)]
pub enum Answer {
    Choice { choices: Vec<String>, gold: usize },
    Generate(Generation),
}

#[derive(Debug, Clone)]
pub struct Generation {
    pub target: String,
    pub until: Vec<String>,
    pub regex: Option<fancy_regex::Regex>,
    pub max_tokens: usize,
}

impl Answer {
    /// The answer a few-shot example shows: the gold choice or the target.
    pub fn shown(&self) -> &str {
        match self {
            Answer::Choice { choices, gold } => &choices[*gold],
            Answer::Generate(generation) => &generation.target,
        }
    }
}

/// Reads and checks `path`.
pub fn read(path: &Path) -> Result<TaskFile, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("--task {}: {e}", path.display()))?;
    parse(path, &text)
}

/// Parses the text of a task file at `path`.
pub fn parse(path: &Path, text: &str) -> Result<TaskFile, String> {
    let mut tasks: Vec<Task> = Vec::new();
    for (index, line) in text.lines().enumerate().filter(|(_, line)| !line.trim().is_empty()) {
        let number = index + 1;
        let at = |field: &str, problem: String| format!("{} line {number}, field `{field}`: {problem}", path.display());
        let value: Value =
            serde_json::from_str(line).map_err(|e| format!("{} line {number}: not JSON ({e})", path.display()))?;
        let Value::Object(object) = value else {
            return Err(format!("{} line {number}: not a JSON object", path.display()));
        };
        let name = string(&object, "task").map_err(|p| at("task", p))?;
        let context = string(&object, "context").map_err(|p| at("context", p))?;
        let answer = answer(&object).map_err(|(field, problem)| at(field, problem))?;
        let fewshot = match object.get("fewshot") {
            None => false,
            Some(Value::Bool(flag)) => *flag,
            Some(_) => return Err(at("fewshot", "expected true or false".into())),
        };
        let item = Item { line: number, context, answer };
        let task = match tasks.iter_mut().position(|task| task.name == name) {
            Some(position) => &mut tasks[position],
            None => {
                tasks.push(Task { name, items: Vec::new(), fewshot: Vec::new() });
                tasks.last_mut().expect("just pushed")
            }
        };
        if task.is_generation() != matches!(item.answer, Answer::Generate(_))
            && !(task.items.is_empty() && task.fewshot.is_empty())
        {
            let (field, kind) = match item.answer {
                Answer::Generate(_) => ("target", "multiple-choice"),
                Answer::Choice { .. } => ("choices", "generation"),
            };
            return Err(at(field, format!("task `{}` holds {kind} items; one task, one kind", task.name)));
        }
        if fewshot {
            task.fewshot.push(item);
        } else {
            task.items.push(item);
        }
    }
    if let Some(task) = tasks.iter().find(|task| task.items.is_empty()) {
        return Err(format!("{}: task `{}` has few-shot examples but no item to score", path.display(), task.name));
    }
    if tasks.is_empty() {
        return Err(format!("{}: no items (one JSON object per line)", path.display()));
    }
    Ok(TaskFile { path: path.to_path_buf(), tasks })
}

fn string(object: &Map<String, Value>, field: &str) -> Result<String, String> {
    match object.get(field) {
        Some(Value::String(text)) => Ok(text.clone()),
        Some(_) => Err("expected a string".into()),
        None => Err("missing".into()),
    }
}

fn strings(value: &Value) -> Option<Vec<String>> {
    value.as_array()?.iter().map(|v| v.as_str().map(str::to_string)).collect()
}

/// The item's answer; the error names the field.
fn answer(object: &Map<String, Value>) -> Result<Answer, (&'static str, String)> {
    match (object.get("choices"), object.get("target")) {
        (Some(_), Some(_)) => Err(("target", "an item has either `choices` and `gold` or `target`, not both".into())),
        (Some(choices), None) => {
            let choices = strings(choices).ok_or(("choices", "expected a list of strings".to_string()))?;
            if choices.len() < 2 {
                return Err(("choices", format!("{} choice(s); at least two", choices.len())));
            }
            if let Some(empty) = choices.iter().position(String::is_empty) {
                return Err(("choices", format!("choice {empty} is empty: an empty continuation has no likelihood")));
            }
            let gold = match object.get("gold") {
                None => return Err(("gold", "missing (the index of the right choice)".into())),
                Some(gold) => gold.as_u64().ok_or(("gold", "expected a whole number".to_string()))? as usize,
            };
            if gold >= choices.len() {
                return Err((
                    "gold",
                    format!("{gold} is out of range for {} choices (0 … {})", choices.len(), choices.len() - 1),
                ));
            }
            Ok(Answer::Choice { choices, gold })
        }
        (None, Some(target)) => {
            let target = target.as_str().ok_or(("target", "expected a string".to_string()))?.to_string();
            let until = match object.get("until") {
                None => vec!["\n\n".to_string()],
                Some(until) => strings(until).ok_or(("until", "expected a list of strings".to_string()))?,
            };
            if until.iter().any(String::is_empty) {
                return Err(("until", "an empty stop sequence would stop before the first token".into()));
            }
            let regex = match object.get("regex") {
                None => None,
                Some(Value::String(pattern)) => {
                    Some(fancy_regex::Regex::new(pattern).map_err(|e| ("regex", format!("does not compile: {e}")))?)
                }
                Some(_) => return Err(("regex", "expected a string".into())),
            };
            let max_tokens = match object.get("max_tokens") {
                None => DEFAULT_MAX_TOKENS,
                Some(value) => match value.as_u64() {
                    Some(count) if count > 0 => count as usize,
                    _ => return Err(("max_tokens", "expected a whole number above 0".into())),
                },
            };
            Ok(Answer::Generate(Generation { target, until, regex, max_tokens }))
        }
        (None, None) => Err(("choices", "missing: an item needs `choices` and `gold`, or `target`".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> String {
        parse(Path::new("t.jsonl"), text).unwrap_err()
    }

    #[test]
    fn reads_both_kinds_and_the_fewshot_pool() {
        let text = concat!(
            r#"{"task": "a", "context": "Q", "choices": ["x", "y"], "gold": 1, "fewshot": true}"#,
            "\n\n",
            r#"{"task": "b", "context": "2+2=", "target": "4", "regex": "(\\d+)", "until": ["\n"]}"#,
            "\n",
            r#"{"task": "a", "context": "R", "choices": ["x", "y", "z"], "gold": 2}"#,
        );
        let file = parse(Path::new("t.jsonl"), text).unwrap();
        assert_eq!(file.tasks.len(), 2);
        let (a, b) = (&file.tasks[0], &file.tasks[1]);
        assert_eq!((a.name.as_str(), a.items.len(), a.fewshot.len(), a.items[0].line), ("a", 1, 1, 4));
        assert!(!a.is_generation() && b.is_generation());
        assert_eq!(a.fewshot[0].answer.shown(), "y");
        let Answer::Generate(generation) = &b.items[0].answer else { panic!("generation") };
        assert_eq!((generation.until.clone(), generation.max_tokens), (vec!["\n".to_string()], 256));
    }

    #[test]
    fn bad_lines_name_the_line_and_field() {
        let cases = [
            ("[1, 2]", "line 1: not a JSON object"),
            ("{", "line 1: not JSON"),
            (r#"{"context": "Q", "choices": ["x", "y"], "gold": 0}"#, "line 1, field `task`: missing"),
            (r#"{"task": "a", "context": "Q", "gold": 0}"#, "line 1, field `choices`: missing"),
            (r#"{"task": "a", "context": "Q", "choices": ["x", "y"]}"#, "field `gold`: missing"),
            (r#"{"task": "a", "context": "Q", "choices": ["x", "y"], "gold": 2}"#, "`gold`: 2 is out of range"),
            (r#"{"task": "a", "context": "Q", "choices": ["x", ""], "gold": 0}"#, "choice 1 is empty"),
            (r#"{"task": "a", "context": "Q", "target": "4", "regex": "("}"#, "`regex`: does not compile"),
            (r#"{"task": "a", "context": "Q", "target": 4}"#, "field `target`: expected a string"),
        ];
        for (text, expected) in cases {
            let message = error(text);
            assert!(message.contains(expected) && message.starts_with("t.jsonl"), "{text}: {message}");
        }
        let mixed = concat!(
            r#"{"task": "a", "context": "Q", "choices": ["x", "y"], "gold": 0}"#,
            "\n",
            r#"{"task": "a", "context": "Q", "target": "4"}"#
        );
        assert!(error(mixed).contains("line 2, field `target`: task `a` holds multiple-choice items"));
        let unscored = r#"{"task": "a", "context": "Q", "choices": ["x", "y"], "gold": 0, "fewshot": true}"#;
        assert!(error(unscored).contains("no item to score"));
    }
}
