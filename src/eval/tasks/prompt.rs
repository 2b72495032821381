//! Prompts and their tokens as lm-evaluation-harness builds them for a plain (non-chat) task: the few-shot
//! examples, each `context + " " + answer + "\n\n"`, then the item's context; a multiple-choice continuation is
//! `" " + choice`, split from its context at the harness's token boundary ([`encode_pair`]).

use super::file::{Item, Task};
use crate::model::tokenizer::Tokenizer;

/// The harness's default `target_delimiter` (between a context and its answer) and `fewshot_delimiter`.
pub const TARGET_DELIMITER: &str = " ";
pub const FEWSHOT_DELIMITER: &str = "\n\n";

/// The prompt of `item`: the first `fewshot` examples of `task`, then the item's context (the harness's
/// `fewshot_context` with the first-n sampler on a separate few-shot split, no description, no chat template).
pub fn prompt(task: &Task, item: &Item, fewshot: usize) -> Result<String, String> {
    if fewshot > task.fewshot.len() {
        return Err(format!(
            "--num-fewshot {fewshot}: task `{}` has {} few-shot example(s) (items with \"fewshot\": true)",
            task.name,
            task.fewshot.len()
        ));
    }
    let mut text = String::new();
    for example in &task.fewshot[..fewshot] {
        text.push_str(&example.context);
        text.push_str(TARGET_DELIMITER);
        text.push_str(example.answer.shown());
        text.push_str(FEWSHOT_DELIMITER);
    }
    text.push_str(&item.context);
    Ok(text)
}

/// Python's `str.isspace` (what the harness's `rstrip` strips): Unicode White_Space and the four separators
/// U+001C … U+001F.
fn python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// The harness's `_encode_pair` for a causal model: the context's trailing whitespace moved to the continuation,
/// the whole text encoded and the context's own tokens split off its front (so a token that spans the boundary
/// belongs to the continuation's side as the whole text's tokenization has it). An empty context is `prefix` (the
/// BOS token, else EOS) unless the continuation already starts with it.
pub fn encode_pair(
    tokenizer: &Tokenizer,
    prefix: Option<u32>,
    context: &str,
    continuation: &str,
) -> Result<(Vec<u32>, Vec<u32>), String> {
    let encode = |text: &str| tokenizer.encode(text).map_err(|e| e.to_string());
    if context.is_empty() {
        let prefix = prefix.ok_or("the prompt is empty and config.json names neither bos_token_id nor eos_token_id")?;
        let continuation = encode(continuation)?;
        return Ok(match continuation.first() {
            Some(&first) if first == prefix => (vec![first], continuation[1..].to_vec()),
            _ => (vec![prefix], continuation),
        });
    }
    let kept = context.trim_end_matches(python_space);
    let moved = &context[kept.len()..];
    let whole = encode(&format!("{kept}{moved}{continuation}"))?;
    let context = encode(kept)?;
    let split = context.len().min(whole.len());
    Ok((context, whole[split..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::super::file::parse;
    use super::*;

    #[test]
    fn fewshot_examples_lead_the_prompt_as_the_harness_joins_them() {
        let text = concat!(
            r#"{"task": "a", "context": "Q1:", "choices": ["x", "y"], "gold": 1, "fewshot": true}"#,
            "\n",
            r#"{"task": "a", "context": "Q2:", "choices": ["x", "y"], "gold": 0, "fewshot": true}"#,
            "\n",
            r#"{"task": "a", "context": "Q3:", "choices": ["x", "y"], "gold": 0}"#,
        );
        let file = parse(std::path::Path::new("t.jsonl"), text).unwrap();
        let task = &file.tasks[0];
        assert_eq!(prompt(task, &task.items[0], 0).unwrap(), "Q3:");
        assert_eq!(prompt(task, &task.items[0], 2).unwrap(), "Q1: y\n\nQ2: x\n\nQ3:");
        assert!(prompt(task, &task.items[0], 3).unwrap_err().contains("has 2 few-shot example(s)"));
    }

    #[test]
    fn trailing_whitespace_moves_to_the_continuation() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("eval/tiny-shakespeare-fp8");
        let tokenizer = Tokenizer::from_dir(&dir).unwrap();
        let (context, continuation) = encode_pair(&tokenizer, Some(256), "Say: \n", "yes").unwrap();
        assert_eq!(context, tokenizer.encode("Say:").unwrap());
        assert_eq!(continuation, tokenizer.encode(" \nyes").unwrap());
        let (context, continuation) = encode_pair(&tokenizer, Some(256), "", "yes").unwrap();
        assert_eq!((context, continuation), (vec![256], tokenizer.encode("yes").unwrap()));
    }
}
