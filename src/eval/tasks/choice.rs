//! Multiple choice by log-likelihood, lm-evaluation-harness's protocol: each choice's continuation `" " + choice`
//! scored as the sum of its tokens' log-probabilities after the prompt; `acc` takes the highest sum, `acc_norm` the
//! highest sum per character of the choice (the harness's `len(choice)`), the first on a tie. An item's choices
//! share its context, which runs once ([`crate::arch::continuations`]); every context and continuation of a task
//! goes through each streamed layer together (up to [`TOKENS_PER_PASS`] tokens a pass).

use super::file::{Answer, Task};
use super::prompt::{encode_pair, prompt, TARGET_DELIMITER};
use super::{ItemScore, MetricOutcome};
use crate::arch::continuations::{Group, RowAt};
use crate::arch::Model;
use crate::model::tokenizer::Tokenizer;
use crate::progress::Reporter;
use crate::runtime::Backend;

/// Tokens forwarded together in one pass over the layers (bounds the activations held per layer).
pub const TOKENS_PER_PASS: usize = 32_768;

/// One choice's continuation to score: item `item`, choice `choice`, its tokens, which the context's last row and
/// then its own rows predict; the running sum of their log-probabilities and whether each is the greedy pick.
struct Request {
    item: usize,
    choice: usize,
    continuation: Vec<u32>,
    sum: f64,
    greedy: bool,
}

/// A context and the requests that continue it.
struct Shared {
    context: Vec<u32>,
    requests: Vec<Request>,
}

impl Shared {
    /// Tokens it puts through the model: the context once, each continuation but its last token.
    fn tokens(&self) -> usize {
        self.context.len() + self.requests.iter().map(|r| r.continuation.len() - 1).sum::<usize>()
    }

    fn group(&self) -> Group {
        let continuations = self.requests.iter().map(|r| r.continuation[..r.continuation.len() - 1].to_vec());
        Group { context: self.context.clone(), continuations: continuations.collect() }
    }
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
    let vocab = model.config().vocab_size;
    let mut shared: Vec<Shared> = Vec::new();
    for (index, item) in task.items.iter().enumerate() {
        let Answer::Choice { choices, .. } = &item.answer else { unreachable!("a multiple-choice task") };
        let context = prompt(task, item, fewshot)?;
        let first = shared.len();
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
            if let Some(&token) = context.iter().chain(&continuation).find(|&&token| token as usize >= vocab) {
                return Err(format!(
                    "line {}: the tokenizer gives token {token}, outside the model's vocab_size {vocab}",
                    item.line
                ));
            }
            window
                .check(&format!("line {}, choice {choice}", item.line), context.len() + continuation.len() - 1, false)
                .map_err(|problem| format!("{problem} (shorten the context or lower --num-fewshot)"))?;
            let request = Request { item: index, choice, continuation, sum: 0.0, greedy: true };
            // The choices of an item share its context (the harness encodes it alone, whatever the choice).
            match shared[first..].iter_mut().find(|s| s.context == context) {
                Some(same) => same.requests.push(request),
                None => shared.push(Shared { context, requests: vec![request] }),
            }
        }
    }
    let mut tokens = vec![0; task.items.len()];
    for group in &shared {
        tokens[group.requests[0].item] += group.tokens();
    }
    for pass in passes(&mut shared) {
        let groups: Vec<Group> = pass.iter().map(Shared::group).collect();
        let mut sink = |at: RowAt, logits: &[f32]| {
            let group = &mut pass[at.group];
            let scored = match at.continuation {
                // The context's last row predicts every continuation's first token.
                None => group.requests.iter_mut().map(|r| (r.continuation[0], r)).collect::<Vec<_>>(),
                Some((c, t)) => {
                    let request = &mut group.requests[c];
                    vec![(request.continuation[t + 1], request)]
                }
            };
            let normalized = LogSoftmax::of(logits);
            for (token, request) in scored {
                request.sum += normalized.at(logits, token as usize);
                request.greedy &= normalized.best == token as usize;
            }
            Ok(())
        };
        model.forward_continuations(backend, &groups, reporter, &mut sink).map_err(|e| e.to_string())?;
    }
    let mut loglikelihoods = vec![Vec::new(); task.items.len()];
    let mut greedy = vec![Vec::new(); task.items.len()];
    for request in shared.iter().flat_map(|group| &group.requests) {
        if !request.sum.is_finite() {
            return Err(format!(
                "line {}: choice {} has a non-finite log-likelihood",
                task.items[request.item].line, request.choice
            ));
        }
        loglikelihoods[request.item].push((request.choice, request.sum));
        greedy[request.item].push((request.choice, request.greedy));
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

/// The contexts and their continuations cut into passes of at most [`TOKENS_PER_PASS`] tokens (a larger one alone).
fn passes(shared: &mut [Shared]) -> Vec<&mut [Shared]> {
    let mut passes = Vec::new();
    let mut rest = shared;
    while !rest.is_empty() {
        let (mut count, mut tokens) = (0, 0);
        while count < rest.len() && (count == 0 || tokens + rest[count].tokens() <= TOKENS_PER_PASS) {
            tokens += rest[count].tokens();
            count += 1;
        }
        let (pass, after) = rest.split_at_mut(count);
        passes.push(pass);
        rest = after;
    }
    passes
}

/// A row of logits as log-probabilities: its largest value, `ln Σ exp(v − max)` (f64) and its first largest index,
/// computed once for every token scored from the row.
struct LogSoftmax {
    max: f64,
    log_sum: f64,
    best: usize,
}

impl LogSoftmax {
    fn of(row: &[f32]) -> Self {
        let best = first_max_f32(row);
        let max = row[best] as f64;
        let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
        Self { max, log_sum: sum.ln(), best }
    }

    /// `log_softmax(row)[token]`.
    fn at(&self, row: &[f32], token: usize) -> f64 {
        row[token] as f64 - self.max - self.log_sum
    }
}

fn first_max_f32(values: &[f32]) -> usize {
    values.iter().enumerate().fold(0, |best, (i, &v)| if v > values[best] { i } else { best })
}

/// numpy's `argmax`: the first index of the largest value.
pub fn first_max(values: &[f64]) -> usize {
    values.iter().enumerate().fold(0, |best, (i, &v)| if v > values[best] { i } else { best })
}
