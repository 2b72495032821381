//! Generation with exact match, as lm-evaluation-harness's `generate_until` runs it: greedy decoding of each
//! item's prompt through the paged KV cache (prefill — on another model with `--split` — then one decode step for
//! all of a batch's items together)
//! until a stop sequence appears in the completion, an end-of-sequence token comes, or `max_tokens` tokens; the
//! completion cut before its first stop sequence; the answer extracted by the item's regex (the harness's regex
//! filter) or the completion itself; `exact_match` when the answer equals the target.

use std::collections::BTreeSet;

use super::file::{Answer, Generation, Task};
use super::prompt::prompt;
use super::{ItemScore, MetricOutcome};
use crate::arch::paged::{DecodeItem, PagedModel};
use crate::format::kv_scales::{KvLayout, KvScales};
use crate::model::tokenizer::Tokenizer;
use crate::runtime::kv_cache::KvDtype;
use crate::runtime::Backend;

/// Items decoded together.
const BATCH: usize = 8;
const PAGE_SIZE: usize = 16;
/// What the regex filter answers when the pattern does not match.
pub const NO_MATCH: &str = "[invalid]";

/// One item being decoded.
struct Running<'a> {
    request: u64,
    prompt: usize,
    generation: &'a Generation,
    tokens: Vec<u32>,
    next: u32,
    done: bool,
}

/// Decodes and scores every item of the generation `task` with `fewshot` examples before each; `eos` are the
/// end-of-sequence ids. With `prefiller`, each prompt is prefilled there and handed over to `decoder` (the split
/// deployment).
pub fn score(
    (decoder, prefiller): (&PagedModel, Option<&PagedModel>),
    backend: &dyn Backend,
    tokenizer: &Tokenizer,
    (task, fewshot): (&Task, usize),
    eos: &BTreeSet<u32>,
) -> Result<Vec<ItemScore>, String> {
    let prompts = encoded(task, tokenizer, fewshot)?;
    for (tokens, item) in prompts.iter().zip(&task.items) {
        decoder
            .config()
            .window
            .check(&format!("line {}", item.line), tokens.len() + max_tokens(item), false)
            .map_err(|problem| format!("{problem} (prompt plus max_tokens; lower max_tokens or --num-fewshot)"))?;
    }
    let longest = prompts.iter().zip(&task.items).map(|(p, item)| p.len() + max_tokens(item)).max().unwrap_or(0);
    let config = decoder.config();
    let scales = decoder.element_scales(&KvScales::unit(KvLayout::of(config), config.num_hidden_layers));
    let pages = BATCH * longest.div_ceil(PAGE_SIZE);
    let mut scores = Vec::with_capacity(task.items.len());
    for (batch, items) in task.items.chunks(BATCH).enumerate() {
        let mut pool = decoder.new_pool(decoder.pool_shape(PAGE_SIZE, pages), KvDtype::F32, scales.clone());
        let mut running = Vec::with_capacity(items.len());
        for (offset, item) in items.iter().enumerate() {
            let Answer::Generate(generation) = &item.answer else { unreachable!("a generation task") };
            let tokens = &prompts[batch * BATCH + offset];
            let request = offset as u64;
            pool.open(request);
            let prefilled = prefiller.unwrap_or(decoder).prefill(backend, tokens).map_err(|e| e.to_string())?;
            PagedModel::hand_over(backend, &mut pool, request, &prefilled).map_err(|e| e.to_string())?;
            let next = argmax(&prefilled.logits);
            running.push(Running { request, prompt: tokens.len(), generation, tokens: Vec::new(), next, done: false });
        }
        loop {
            for item in running.iter_mut().filter(|item| !item.done) {
                if eos.contains(&item.next) {
                    item.done = true;
                    continue;
                }
                item.tokens.push(item.next);
                let text = tokenizer.decode(&item.tokens);
                item.done = item.tokens.len() >= item.generation.max_tokens
                    || item.generation.until.iter().any(|stop| text.contains(stop.as_str()));
            }
            let steps: Vec<DecodeItem> = running
                .iter()
                .filter(|item| !item.done)
                .map(|item| DecodeItem {
                    request: item.request,
                    token: item.next,
                    position: item.prompt + item.tokens.len() - 1,
                })
                .collect();
            if steps.is_empty() {
                break;
            }
            let step = decoder.decode(backend, &mut pool, &steps, true).map_err(|e| e.to_string())?;
            let live = running.iter_mut().filter(|item| !item.done);
            for (item, logits) in live.zip(step.logits) {
                item.next = argmax(&logits.map_err(|fault| fault.to_string())?);
            }
        }
        for (item, run) in items.iter().zip(running) {
            let completion = cut(&tokenizer.decode(&run.tokens), &run.generation.until);
            let answer = extract(&completion, run.generation.regex.as_ref());
            let correct = answer == run.generation.target;
            scores.push(ItemScore {
                line: item.line,
                metrics: vec![MetricOutcome { metric: "exact_match".into(), prediction: answer, correct }],
                tokens: run.prompt + run.tokens.len(),
                loglikelihoods: Vec::new(),
                greedy: Vec::new(),
                completion: Some(completion),
            });
        }
    }
    Ok(scores)
}

/// Each item's prompt tokens; an empty prompt is an error naming its line.
fn encoded(task: &Task, tokenizer: &Tokenizer, fewshot: usize) -> Result<Vec<Vec<u32>>, String> {
    let mut prompts = Vec::with_capacity(task.items.len());
    for item in &task.items {
        let tokens = tokenizer.encode(&prompt(task, item, fewshot)?).map_err(|e| e.to_string())?;
        if tokens.is_empty() {
            return Err(format!("line {}: the prompt is empty; there is nothing to generate from", item.line));
        }
        prompts.push(tokens);
    }
    Ok(prompts)
}

/// The most positions an item of `task` can take: its prompt and `max_tokens` (what the decoder is opened for).
pub fn longest(task: &Task, tokenizer: &Tokenizer, fewshot: usize) -> Result<usize, String> {
    let prompts = encoded(task, tokenizer, fewshot)?;
    Ok(prompts.iter().zip(&task.items).map(|(p, item)| p.len() + max_tokens(item)).max().unwrap_or(0))
}

fn max_tokens(item: &super::file::Item) -> usize {
    match &item.answer {
        Answer::Generate(generation) => generation.max_tokens,
        Answer::Choice { .. } => 0,
    }
}

/// The first index of the largest logit (greedy decoding's choice).
fn argmax(logits: &[f32]) -> u32 {
    logits.iter().enumerate().fold(0, |best, (i, &v)| if v > logits[best] { i } else { best }) as u32
}

/// `text` cut before the first occurrence of each stop sequence in turn (the harness's post-processing).
pub fn cut(text: &str, until: &[String]) -> String {
    until.iter().fold(text.to_string(), |text, stop| text.split(stop.as_str()).next().unwrap_or("").to_string())
}

/// The harness's regex filter (group_select 0): the first match; with groups its first non-empty group (the
/// fallback when all are empty; with one group, that group even empty); stripped; [`NO_MATCH`] without a match.
/// Without a regex, the completion itself.
pub fn extract(completion: &str, regex: Option<&fancy_regex::Regex>) -> String {
    let Some(regex) = regex else { return completion.to_string() };
    let Ok(Some(captures)) = regex.captures(completion) else { return NO_MATCH.to_string() };
    let found = match captures.len() {
        1 => captures.get(0).map_or("", |m| m.as_str()),
        2 => captures.get(1).map_or("", |m| m.as_str()),
        _ => match (1..captures.len()).filter_map(|group| captures.get(group)).find(|m| !m.as_str().is_empty()) {
            Some(group) => group.as_str(),
            None => NO_MATCH,
        },
    };
    found.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_are_cut_and_answers_extracted_as_the_harness_does() {
        assert_eq!(cut("42\nQ: next\n\nmore", &["\n\n".into(), "Q:".into()]), "42\n");
        assert_eq!(cut("no stop", &["\n".into()]), "no stop");
        let regex = |pattern: &str| fancy_regex::Regex::new(pattern).unwrap();
        assert_eq!(extract(" so 12 then 13", Some(&regex(r"\d+"))), "12");
        assert_eq!(extract("answer: 7 ", Some(&regex(r"answer: (\d+)"))), "7");
        assert_eq!(extract("b", Some(&regex(r"(a)|(b)"))), "b");
        assert_eq!(extract("none", Some(&regex(r"\d+"))), NO_MATCH);
        assert_eq!(extract(" raw ", None), " raw ");
    }
}
