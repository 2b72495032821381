//! Multiple choice by log-likelihood, lm-evaluation-harness's protocol: each choice's continuation `" " + choice`
//! scored as the sum of its tokens' log-probabilities after the prompt; `acc` takes the highest sum, `acc_norm` the
//! highest sum per character of the choice (the harness's `len(choice)`), the first on a tie. Every continuation of
//! a task goes through each streamed layer together (up to [`TOKENS_PER_PASS`] tokens a pass).

use super::file::{Answer, Task};
use super::prompt::{encode_pair, prompt, TARGET_DELIMITER};
use super::{ItemScore, MetricOutcome};
use crate::arch::Model;
use crate::model::tokenizer::Tokenizer;
use crate::progress::Reporter;
use crate::runtime::{Backend, RuntimeError};

/// Tokens forwarded together in one pass over the layers (bounds the activations held per layer).
pub const TOKENS_PER_PASS: usize = 32_768;

/// One continuation to score: item `item`, choice `choice`, the tokens fed (context and continuation but the last)
/// and the continuation's tokens, which rows `context − 1 …` predict.
struct Request {
    item: usize,
    choice: usize,
    input: Vec<u32>,
    context: usize,
    continuation: Vec<u32>,
}

/// Scores every item of the multiple-choice `task` with `fewshot` examples before each; an empty prompt is
/// conditioned on `prefix` (the model's BOS token, else EOS).
pub fn score(
    model: &Model,
    backend: &dyn Backend,
    tokenizer: &Tokenizer,
    (task, fewshot, prefix): (&Task, usize, Option<u32>),
    reporter: &dyn Reporter,
) -> Result<Vec<ItemScore>, String> {
    let window = &model.config().window;
    let mut requests = Vec::new();
    for (index, item) in task.items.iter().enumerate() {
        let Answer::Choice { choices, .. } = &item.answer else { unreachable!("a multiple-choice task") };
        let context = prompt(task, item, fewshot)?;
        for (choice, text) in choices.iter().enumerate() {
            let (context, continuation) =
                encode_pair(tokenizer, prefix, &context, &format!("{TARGET_DELIMITER}{text}"))
                    .map_err(|problem| format!("line {}: {problem}", item.line))?;
            if continuation.is_empty() {
                return Err(format!("line {}: choice {choice} ({text:?}) encodes to no token", item.line));
            }
            if context.is_empty() {
                return Err(format!(
                    "line {}: the prompt is only whitespace, which leaves no token to condition on; give it text",
                    item.line
                ));
            }
            let vocab = model.config().vocab_size;
            if let Some(&token) = context.iter().chain(&continuation).find(|&&token| token as usize >= vocab) {
                return Err(format!(
                    "line {}: the tokenizer gives token {token}, outside the model's vocab_size {vocab}",
                    item.line
                ));
            }
            let mut input = [context.as_slice(), &continuation].concat();
            input.pop();
            window
                .check(&format!("line {}, choice {choice}", item.line), input.len(), false)
                .map_err(|problem| format!("{problem} (shorten the context or lower --num-fewshot)"))?;
            requests.push(Request { item: index, choice, input, context: context.len(), continuation });
        }
    }
    let vocab = model.config().vocab_size;
    let mut tokens = vec![0; task.items.len()];
    for request in &requests {
        tokens[request.item] += request.input.len();
    }
    let mut loglikelihoods = vec![Vec::new(); task.items.len()];
    let mut greedy = vec![Vec::new(); task.items.len()];
    for pass in passes(&requests) {
        let sequences: Vec<Vec<u32>> = pass.iter().map(|request| request.input.clone()).collect();
        let mut sink = |index: usize, logits: &[f32]| {
            let request = &pass[index];
            let (mut sum, mut argmax_all) = (0.0f64, true);
            for (offset, &token) in request.continuation.iter().enumerate() {
                let row = &logits[(request.context - 1 + offset) * vocab..][..vocab];
                let (logprob, best) = log_softmax_at(row, token as usize);
                sum += logprob;
                argmax_all &= best == token as usize;
            }
            if !sum.is_finite() {
                return Err(RuntimeError::Input(format!(
                    "line {}: choice {} has a non-finite log-likelihood",
                    task.items[request.item].line, request.choice
                )));
            }
            loglikelihoods[request.item].push((request.choice, sum));
            greedy[request.item].push((request.choice, argmax_all));
            Ok(())
        };
        model.forward(backend, &sequences, reporter, &mut sink).map_err(|e| e.to_string())?;
    }
    Ok(task
        .items
        .iter()
        .zip(loglikelihoods)
        .zip(greedy)
        .zip(tokens)
        .map(|(((item, mut lls), mut greedy), tokens)| {
            let Answer::Choice { choices, gold } = &item.answer else { unreachable!("a multiple-choice task") };
            lls.sort_by_key(|&(choice, _)| choice);
            greedy.sort_by_key(|&(choice, _)| choice);
            let lls: Vec<f64> = lls.into_iter().map(|(_, ll)| ll).collect();
            let lengths: Vec<f64> = choices.iter().map(|c| c.chars().count() as f64).collect();
            let normed: Vec<f64> = lls.iter().zip(&lengths).map(|(ll, length)| ll / length).collect();
            let (choice, choice_norm) = (first_max(&lls), first_max(&normed));
            ItemScore {
                line: item.line,
                metrics: vec![
                    MetricOutcome { metric: "acc".into(), prediction: choice.to_string(), correct: choice == *gold },
                    MetricOutcome {
                        metric: "acc_norm".into(),
                        prediction: choice_norm.to_string(),
                        correct: choice_norm == *gold,
                    },
                ],
                tokens,
                loglikelihoods: lls,
                greedy: greedy.into_iter().map(|(_, g)| g).collect(),
                completion: None,
            }
        })
        .collect())
}

/// The requests cut into passes of at most [`TOKENS_PER_PASS`] tokens (a longer request alone).
fn passes(requests: &[Request]) -> Vec<&[Request]> {
    let mut passes = Vec::new();
    let (mut start, mut tokens) = (0, 0);
    for (index, request) in requests.iter().enumerate() {
        if index > start && tokens + request.input.len() > TOKENS_PER_PASS {
            passes.push(&requests[start..index]);
            (start, tokens) = (index, 0);
        }
        tokens += request.input.len();
    }
    if start < requests.len() {
        passes.push(&requests[start..]);
    }
    passes
}

/// `log_softmax(row)[token]` in f64 and the row's first largest index.
fn log_softmax_at(row: &[f32], token: usize) -> (f64, usize) {
    let best = first_max_f32(row);
    let max = row[best] as f64;
    let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
    (row[token] as f64 - max - sum.ln(), best)
}

fn first_max_f32(values: &[f32]) -> usize {
    values.iter().enumerate().fold(0, |best, (i, &v)| if v > values[best] { i } else { best })
}

/// numpy's `argmax`: the first index of the largest value.
pub fn first_max(values: &[f64]) -> usize {
    values.iter().enumerate().fold(0, |best, (i, &v)| if v > values[best] { i } else { best })
}
