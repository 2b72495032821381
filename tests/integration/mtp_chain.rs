//! `eval --mtp-depth K`'s chained drafts (`arch::mtp_chain`) against chains recomputed by the full-sequence MTP
//! layer on synthetic models.

use squeeze::arch::context::{LayerContext, LayerState, Residual};
use squeeze::arch::moe::ExpertTimes;
use squeeze::arch::mtp::MtpLayer;
use squeeze::arch::mtp_chain::{chain_starts, chained_drafts};
use squeeze::arch::paged::PagedModel;
use squeeze::arch::rope::rope_setup;
use squeeze::arch::tap::KvSource;
use squeeze::load::open::open_checkpoint;
use squeeze::load::weights::WeightReader;
use squeeze::metrics::argmax;
use squeeze::runtime::{Backend, Cpu, Spans};
use squeeze::synth::SynthArch;

use crate::common::synth_in_process;

/// The pool's chains equal chains recomputed from scratch by the full-sequence layer: for a start `t`, rows
/// `0..=t` from the main model's hidden states and the text, then one more row per draft from the previous
/// row's output and greedy token, the whole sequence run again for each draft.
fn check(arch: SynthArch) {
    let (_dir, out) = synth_in_process(arch, 11);
    let tokens: Vec<u32> = (0..13u32).map(|i| (i * 41 + 3) % 250).collect();
    let depth = 3;
    let decoder = PagedModel::open(&out, 32).unwrap().with_mtp().unwrap().expect("an MTP layer");
    let normed = decoder.prefill(&Cpu::default(), &tokens).unwrap().normed;
    let (checkpoint, config) = open_checkpoint(&out).unwrap();
    let reader = WeightReader::new(&checkpoint);
    let mtp = MtpLayer::load(&reader, &config).unwrap().unwrap();
    let (table, mla_scale) = rope_setup(&config, tokens.len());
    let context = LayerContext { backend: &Cpu::default(), reader: &reader, config: &config, table: &table, mla_scale };
    let width = config.hidden_size;
    let spans = Spans::new(&[tokens.len()]);
    let host = Cpu::default().upload(&normed, width).unwrap();
    let chains = chained_drafts(&context, &mtp, &host, std::slice::from_ref(&tokens), &spans, depth).unwrap();
    let chain = &chains[0];
    assert_eq!(chain.len(), chain_starts(tokens.len(), depth) * depth);

    for t in [0, 4, chain_starts(tokens.len(), depth) - 1] {
        let mut next: Vec<u32> = tokens[1..=t + 1].to_vec();
        let mut previous: Vec<f32> = normed[..(t + 1) * width].to_vec();
        let mut drafted = Vec::new();
        for _ in 0..depth {
            let rows = next.len();
            let first: Vec<bool> = (0..rows).map(|row| row == 0).collect();
            let input = mtp.input(
                &Cpu::default(),
                &reader,
                &config,
                &next,
                &first,
                &Cpu::default().upload(&previous, width).unwrap(),
            );
            let mut hidden = input.unwrap();
            let mut state = LayerState::default();
            let (spans, times) = (Spans::new(&[rows]), ExpertTimes::default());
            let residual = Residual { hidden: &mut hidden, spans: &spans, state: &mut state };
            mtp.layer().forward(&context, residual, KvSource::Own, &times, None).unwrap();
            let last = (&Cpu::default() as &dyn Backend).row_range(&hidden, rows - 1..rows).unwrap();
            let token = argmax(&mtp.head_logits(&Cpu::default(), &config, &last).unwrap());
            drafted.push(token);
            next.push(token);
            previous.extend_from_slice(&Cpu::default().download(&last).unwrap());
        }
        assert_eq!(&chain[t * depth..][..depth], &drafted[..], "{arch:?}: the chain from position {t}");
    }
}

#[test]
fn pooled_chains_equal_chains_recomputed_by_the_full_sequence_layer() {
    for arch in [SynthArch::Glm45, SynthArch::Glm5, SynthArch::Glm52] {
        check(arch);
    }
}
