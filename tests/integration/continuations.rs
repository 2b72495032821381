//! Shared contexts (`arch::continuations`, what `eval --task` scores multiple choice with) against the
//! layer-streamed forward of each context and continuation joined, on synthetic models of every architecture: every
//! scored row's logits agree, so a context run once serves each of its continuations.

use squeeze::arch::continuations::{Group, RowAt};
use squeeze::arch::Model;
use squeeze::progress::Silent;
use squeeze::runtime::Cpu;
use squeeze::synth::SynthArch;

use crate::common::synth_in_process;

/// The continuations' steps are decode steps over an F32 cache: the paged decode's bound against the full forward
/// (tests/integration/paged.rs: a few f32 ulps of O(1) logits, amplified by up to three layers).
const MAX_ABS: f32 = 2e-4;

/// Contexts of `lengths`, each followed by continuations of 0, 1, 4 and 9 tokens (the empty one scores the context's
/// last row alone), against the full forward of every joined sequence.
fn check(arch: SynthArch, seed: u64, lengths: &[usize]) {
    let (_dir, out) = synth_in_process(arch, seed);
    let model = Model::open(&out).unwrap();
    let vocab = model.config().vocab_size;
    let token = |i: usize| ((i * 37 + 11) % 250) as u32;
    let groups: Vec<Group> = lengths
        .iter()
        .enumerate()
        .map(|(g, &length)| Group {
            context: (0..length).map(|i| token(i + 7 * g)).collect(),
            continuations: [0, 1, 4, 9]
                .iter()
                .enumerate()
                .map(|(c, &n)| (0..n).map(|i| token(300 + 13 * c + 5 * g + i)).collect())
                .collect(),
        })
        .collect();
    let joined: Vec<Vec<u32>> =
        groups.iter().flat_map(|g| g.continuations.iter().map(|c| [g.context.as_slice(), c].concat())).collect();
    let mut full: Vec<Vec<f32>> = vec![Vec::new(); joined.len()];
    model
        .forward(&Cpu::default(), &joined, &Silent, &mut |index, logits| {
            full[index] = logits.to_vec();
            Ok(())
        })
        .unwrap();
    let (mut rows, mut worst) = (0, 0.0f32);
    model
        .forward_continuations(&Cpu::default(), &groups, &Silent, &mut |at: RowAt, logits| {
            let per_group = groups[at.group].continuations.len();
            let context = groups[at.group].context.len();
            // The context's last row is the same in every joined sequence of its group: check it in each.
            let expected: Vec<(usize, usize)> = match at.continuation {
                None => (0..per_group).map(|c| (at.group * per_group + c, context - 1)).collect(),
                Some((c, t)) => vec![(at.group * per_group + c, context + t)],
            };
            for (sequence, row) in expected {
                let want = &full[sequence][row * vocab..][..vocab];
                worst = worst.max(logits.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max));
            }
            rows += 1;
            Ok(())
        })
        .unwrap();
    // Every context's last row and every continuation token.
    assert_eq!(rows, lengths.len() * (1 + 1 + 4 + 9), "{arch:?}: every row scored once");
    println!("{arch:?}: {rows} rows, max |Δlogit| {worst}");
    assert!(worst <= MAX_ABS, "{arch:?}: max |Δlogit| {worst} > {MAX_ABS}");
}

#[test]
fn shared_contexts_give_the_full_forward_kimi() {
    check(SynthArch::KimiK2, 3, &[5, 23, 2]);
}

/// GLM-5: the DSA indexer chooses among the context's keys and the continuation's (top-k below the longest
/// sequences), in the context's prefill and in every step.
#[test]
fn shared_contexts_give_the_full_forward_glm5_with_dsa() {
    check(SynthArch::Glm5, 3, &[5, 23, 1]);
}

/// GLM-5.2: shared DSA layers reuse the last indexer layer's choice, per context and per step.
#[test]
fn shared_contexts_give_the_full_forward_glm52_shared_indexer() {
    check(SynthArch::Glm52, 3, &[6, 21]);
}

#[test]
fn shared_contexts_give_the_full_forward_glm45_gqa() {
    check(SynthArch::Glm45, 3, &[5, 23, 2]);
}

/// Kimi-Linear: each continuation from a copy of its context's KDA state, around a NoPE MLA layer's rows.
#[test]
fn shared_contexts_give_the_full_forward_kimi_linear() {
    check(SynthArch::KimiLinear, 4, &[5, 23, 2]);
}

/// GLM-5.3-Flash: mHC streams, KDA states and the k-pool indexer (past 20 tokens its full layer keeps complete
/// pools and the tail).
#[test]
fn shared_contexts_give_the_full_forward_glm53_flash() {
    check(SynthArch::Glm53Flash, 5, &[5, 26]);
}

/// DeepSeek-V4: a context past the sliding window (16) and the first HCA window (128), continuations that close
/// CSA windows of their own.
#[test]
fn shared_contexts_give_the_full_forward_deepseek_v4() {
    check(SynthArch::DeepseekV4, 3, &[6, 37, 130]);
}
