//! squeeze's FP8 codec and INT4 quantizer against golden files produced by torch 2.15 and compressed-tensors
//! 0.20.1 (`scripts/oracle/make-fp8-golden.py`, `make-int4-golden.py`): bit-exact agreement required.

use std::path::Path;

use half::bf16;
use squeeze::io::ShardFile;
use squeeze::quant::fp8_block::{dequantize_row, BlockGrid};
use squeeze::quant::{fp4, fp8, int4, pack, w4a8, ScaleRule};

fn open(name: &str) -> ShardFile {
    ShardFile::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name)).expect("golden file")
}

fn f32s(shard: &ShardFile, name: &str) -> Vec<f32> {
    shard
        .get(name)
        .unwrap_or_else(|| panic!("{name}"))
        .bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn u32s(shard: &ShardFile, name: &str) -> Vec<u32> {
    shard
        .get(name)
        .unwrap_or_else(|| panic!("{name}"))
        .bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

#[test]
fn fp8_decode_matches_torch_on_all_256_codes() {
    let golden = open("fp8_e4m3fn.safetensors");
    let decode = f32s(&golden, "decode");
    for code in 0..=255u8 {
        let (ours, torch) = (fp8::decode(code), decode[code as usize]);
        assert!(
            ours.to_bits() == torch.to_bits() || (ours.is_nan() && torch.is_nan()),
            "code {code:#04x}: {ours} vs torch {torch}"
        );
    }
}

#[test]
fn fp8_encode_matches_torch_on_every_midpoint_and_random_values() {
    let golden = open("fp8_e4m3fn.safetensors");
    for (values, codes) in [("midpoint_values", "midpoint_codes"), ("random_values", "random_codes")] {
        let values = f32s(&golden, values);
        let codes = golden.get(codes).unwrap().bytes;
        assert_eq!(values.len(), codes.len());
        let mismatches: Vec<String> = values
            .iter()
            .zip(codes)
            .filter(|(v, c)| fp8::encode(**v) != **c)
            .take(5)
            .map(|(v, c)| format!("{v:e}: ours {:#04x}, torch {c:#04x}", fp8::encode(*v)))
            .collect();
        assert!(mismatches.is_empty(), "{mismatches:?}");
    }
}

#[test]
fn int4_ct_minmax_packs_exactly_as_compressed_tensors() {
    let golden = open("ct_int4.safetensors");
    let cases: usize = golden.metadata()["cases"].parse().unwrap();
    for case in 0..cases {
        let group_size: usize = golden.metadata()[&format!("case{case}.group_size")].parse().unwrap();
        let weight = golden.get(&format!("case{case}.weight")).unwrap();
        let (rows, columns) = (weight.shape[0], weight.shape[1]);
        let weights = f32s(&golden, &format!("case{case}.weight"));
        // The F32 weight is exactly the dequantized FP8 source where the golden has one.
        if let Some(codes) = golden.get(&format!("case{case}.source_fp8")) {
            let scales = f32s(&golden, &format!("case{case}.source_scale_inv"));
            let grid = BlockGrid::new(rows, columns, 128, 128);
            let mut row = vec![0f32; columns];
            for r in 0..rows {
                dequantize_row(&grid, r, &codes.bytes[r * columns..][..columns], &scales, &mut row);
                assert_eq!(row.as_slice(), &weights[r * columns..][..columns], "case {case} row {r} dequant");
            }
        }
        let want_packed = u32s(&golden, &format!("case{case}.weight_packed"));
        let want_scales: Vec<u16> = golden
            .get(&format!("case{case}.weight_scale"))
            .unwrap()
            .bytes
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        let (words, groups) = (pack::packed_columns(columns), columns / group_size);
        let (mut q, mut scales, mut packed) = (vec![0i8; columns], vec![bf16::ZERO; groups], vec![0u32; words]);
        for r in 0..rows {
            int4::quantize_row(
                &weights[r * columns..][..columns],
                group_size,
                ScaleRule::CtMinmax,
                &mut q,
                &mut scales,
            );
            pack::pack_row(&q, &mut packed);
            let got_scales: Vec<u16> = scales.iter().map(|s| s.to_bits()).collect();
            assert_eq!(got_scales.as_slice(), &want_scales[r * groups..][..groups], "case {case} row {r} scales");
            assert_eq!(packed.as_slice(), &want_packed[r * words..][..words], "case {case} row {r} packed");
        }
    }
    let example: Vec<i8> = golden.get("pack_example.q").unwrap().bytes.iter().map(|b| *b as i8).collect();
    let mut word = [0u32];
    pack::pack_row(&example, &mut word);
    assert_eq!(word[0], u32s(&golden, "pack_example.packed")[0]);
    assert_eq!(word[0], 0xfba9_8710);
}

fn bytes(shard: &ShardFile, name: &str) -> Vec<u8> {
    shard.get(name).unwrap_or_else(|| panic!("{name} missing")).bytes.to_vec()
}

/// NVFP4 of `weights` `[rows, columns]` under `global`: packed bytes and E4M3 scale bytes, as `quantize` writes
/// them (`nvfp4_quantize_row_packed`), checked against codes then `pack` row by row.
fn nvfp4(weights: &[f32], columns: usize, global: f32) -> (Vec<u8>, Vec<u8>) {
    let (mut packed, mut scales) = (Vec::new(), Vec::new());
    let (mut codes, mut row_packed, mut row_scales) =
        (vec![0u8; columns], vec![0u8; columns / 2], vec![0u8; columns / fp4::NVFP4_GROUP]);
    let (mut unfused_packed, mut unfused_scales) = (row_packed.clone(), row_scales.clone());
    for row in weights.chunks(columns) {
        fp4::nvfp4_quantize_row_packed(row, global, &mut row_packed, &mut row_scales);
        fp4::nvfp4_quantize_row(row, global, &mut codes, &mut unfused_scales);
        fp4::pack(&codes, &mut unfused_packed);
        assert_eq!((&row_packed, &row_scales), (&unfused_packed, &unfused_scales), "packed in one pass or two");
        packed.extend_from_slice(&row_packed);
        scales.extend_from_slice(&row_scales);
    }
    (packed, scales)
}

/// compressed-tensors 0.20.1's NVFP4 and MXFP4 (`scripts/oracle/make-fp4-golden.py`): the same global scales,
/// packed bytes and scale bytes, and its decompression equals squeeze's dequantization bit for bit.
#[test]
fn fp4_packs_exactly_as_compressed_tensors_and_reads_back_as_it_decompresses() {
    let golden = open("ct_fp4.safetensors");
    let cases: usize = golden.metadata()["cases"].parse().unwrap();
    let mut names: Vec<String> = (0..cases).map(|case| format!("case{case}")).collect();
    names.extend(["pair.gate".to_string(), "pair.up".to_string()]);
    let pair_global = fp4::nvfp4_global_scale(
        fp4::absmax(&f32s(&golden, "pair.gate.weight")).max(fp4::absmax(&f32s(&golden, "pair.up.weight"))),
    );
    for name in &names {
        let weight = golden.get(&format!("{name}.weight")).unwrap();
        let columns = weight.shape[1];
        let weights = f32s(&golden, &format!("{name}.weight"));
        let global =
            if name.starts_with("pair.") { pair_global } else { fp4::nvfp4_global_scale(fp4::absmax(&weights)) };
        assert_eq!(global, f32s(&golden, &format!("{name}.nvfp4.weight_global_scale"))[0], "{name}: global scale");
        let (packed, scales) = nvfp4(&weights, columns, global);
        assert_eq!(scales, bytes(&golden, &format!("{name}.nvfp4.weight_scale")), "{name}: NVFP4 scales");
        assert_eq!(packed, bytes(&golden, &format!("{name}.nvfp4.weight_packed")), "{name}: NVFP4 packed");
        let mut codes = vec![0u8; columns];
        let mut values = vec![0f32; weights.len()];
        for ((row, packed), scales) in
            values.chunks_mut(columns).zip(packed.chunks(columns / 2)).zip(scales.chunks(columns / fp4::NVFP4_GROUP))
        {
            fp4::unpack(packed, &mut codes);
            fp4::nvfp4_dequantize_row(&codes, scales, global, row);
        }
        let want = f32s(&golden, &format!("{name}.nvfp4.decompressed"));
        assert!(values.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{name}: NVFP4 values");
        if name.starts_with("pair.") {
            continue;
        }
        let (mut packed, mut exponents) = (Vec::new(), Vec::new());
        let (mut row_packed, mut row_exponents) = (vec![0u8; columns / 2], vec![0u8; columns / fp4::MXFP4_GROUP]);
        for row in weights.chunks(columns) {
            fp4::mxfp4_quantize_row(row, &mut codes, &mut row_exponents);
            fp4::pack(&codes, &mut row_packed);
            packed.extend_from_slice(&row_packed);
            exponents.extend_from_slice(&row_exponents);
        }
        assert_eq!(exponents, bytes(&golden, &format!("{name}.mxfp4.weight_scale")), "{name}: MXFP4 exponents");
        assert_eq!(packed, bytes(&golden, &format!("{name}.mxfp4.weight_packed")), "{name}: MXFP4 packed");
        for ((row, packed), exponents) in
            values.chunks_mut(columns).zip(packed.chunks(columns / 2)).zip(exponents.chunks(columns / fp4::MXFP4_GROUP))
        {
            fp4::unpack(packed, &mut codes);
            fp4::mxfp4_dequantize_row(&codes, exponents, row);
        }
        let want = f32s(&golden, &format!("{name}.mxfp4.decompressed"));
        assert!(values.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{name}: MXFP4 values");
    }
}

/// vLLM's W4A4 NVFP4 activation emulation (`scripts/oracle/make-nvfp4-activation-golden.py`,
/// `ref_nvfp4_quant_dequant` on the CPU): squeeze's activation quantize-dequantize gives the same values.
#[test]
fn nvfp4_activations_quantize_as_vllms_emulation() {
    let golden = open("vllm_nvfp4_activations.safetensors");
    let mut cases = 0;
    while golden.get(&format!("case{cases}.x")).is_some() {
        let mut x = f32s(&golden, &format!("case{cases}.x"));
        let global = f32s(&golden, &format!("case{cases}.global"))[0];
        fp4::nvfp4_fake_quantize_activations(&mut x, global);
        for (index, (got, want)) in x.iter().zip(f32s(&golden, &format!("case{cases}.dequant"))).enumerate() {
            assert!(*got == want, "case {cases} element {index}: {got:e}, vLLM {want:e}");
        }
        cases += 1;
    }
    assert_eq!(cases, 4, "the golden's cases");
}

/// vLLM's W4A8-FP8 (CUTLASS, Hopper) numerics (`scripts/oracle/make-w4a8-golden.py`, running vLLM's
/// `QuantFP8.forward_native` per token, `convert_bf16_scales_to_fp8` and its kernel test's weight reference): squeeze's
/// per-token activation quantization and its W4A8 weights give the same values, bit for bit.
#[test]
fn w4a8_activations_and_weights_match_vllms_numerics() {
    let golden = open("vllm_w4a8.safetensors");
    let mut tokens = 0;
    while golden.get(&format!("tokens{tokens}.x")).is_some() {
        let x = golden.get(&format!("tokens{tokens}.x")).unwrap();
        let width = x.shape[1];
        let mut values = f32s(&golden, &format!("tokens{tokens}.x"));
        w4a8::fake_quantize_tokens(&mut values, width);
        for (index, (got, want)) in values.iter().zip(f32s(&golden, &format!("tokens{tokens}.dequant"))).enumerate() {
            assert!(*got == want, "tokens {tokens} element {index}: {got:e}, vLLM {want:e}");
        }
        tokens += 1;
    }
    let mut weights = 0;
    while let Some(codes) = golden.get(&format!("weight{weights}.codes")) {
        let (rows, columns) = (codes.shape[0], codes.shape[1]);
        let codes: Vec<i8> = codes.bytes.iter().map(|&byte| byte as i8).collect();
        let scales: Vec<f32> = golden
            .get(&format!("weight{weights}.scales"))
            .unwrap()
            .bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect();
        let groups = scales.len() / rows;
        let want = f32s(&golden, &format!("weight{weights}.dequant"));
        let mut row = vec![0f32; columns];
        for r in 0..rows {
            w4a8::dequantize_row(
                &codes[r * columns..][..columns],
                &scales[r * groups..][..groups],
                columns / groups,
                &mut row,
            );
            for (column, (got, want)) in row.iter().zip(&want[r * columns..][..columns]).enumerate() {
                assert!(got == want, "weight {weights} [{r}, {column}]: {got:e}, vLLM {want:e}");
            }
        }
        weights += 1;
    }
    assert_eq!((tokens, weights), (3, 3), "the golden's cases");
}
