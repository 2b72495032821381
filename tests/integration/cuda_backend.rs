//! The CUDA backend end to end: `eval`, parity `eval`, `calibrate-kv` and `serve-test` with `--device emulated`
//! (every runtime op through kernels/*.cu compiled for the host) against `--device cpu` on tiny synthetic models of
//! the three architectures, and INT4 models with 8 routed experts through the grouped W4A16 kernel. On a machine with a GPU, scripts/gpu-check.sh runs the same comparison with
//! `--device cuda`.

use std::path::Path;

use serde_json::Value;

use crate::common::{path_str, squeeze, synth};

/// The kernels sum in a different order than the CPU (warp-shuffle trees, split rows); over a few layers this moves
/// f32 logits by ~1e-6 relative. 1e-4 leaves headroom and still catches any wrong index, scale or mask.
const LOGITS_REL_L2: f64 = 1e-4;
/// Mean NLL moves with the logits: well under 1e-4 nats.
const NLL_ABS: f64 = 1e-4;
/// KV scales are amax / 448 of values that differ by summation order only.
const SCALE_REL: f64 = 1e-4;

/// Parity KLD: see the comment where it is used.
const PARITY_KLD_REL: f64 = 5e-2;

/// A small model: emulation runs every CUDA thread as a fiber, so keep it to a few hundred thousand weights.
const SMALL: [&str; 10] =
    ["--layers", "2", "--hidden", "96", "--experts", "4", "--moe-intermediate", "64", "--vocab", "260"];

fn read_logits(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let logits = tensors.tensor("logits").unwrap();
    logits.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

fn eval(model: &Path, device: &str, logits: &Path) -> Value {
    squeeze(&[
        "eval",
        path_str(model),
        "--data",
        concat!(env!("CARGO_MANIFEST_DIR"), "/eval/sonnets.txt"),
        "--ctx",
        "24",
        "--chunks",
        "2",
        "--device",
        device,
        "--save-logits",
        path_str(logits),
        "--json",
    ])
    .ok()
    .json()
}

fn eval_matches_cpu(arch: &str, int4: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut model = synth(dir.path(), "fp8", arch, &SMALL);
    if int4 {
        let out = dir.path().join("int4");
        squeeze(&["quantize", path_str(&model), path_str(&out)]).ok();
        model = out;
    }
    let (cpu_logits, gpu_logits) = (dir.path().join("cpu.safetensors"), dir.path().join("gpu.safetensors"));
    let cpu = eval(&model, "cpu", &cpu_logits);
    let gpu = eval(&model, "emulated", &gpu_logits);
    assert!(gpu["backend"].as_str().unwrap().starts_with("cuda: emulated"), "{gpu}");
    assert_eq!(cpu["backend"], "cpu");
    let rel = squeeze::metrics::rel_l2(&read_logits(&gpu_logits), &read_logits(&cpu_logits));
    assert!(rel < LOGITS_REL_L2, "{arch} int4={int4}: logits rel L2 {rel:e}");
    let nll = (gpu["mean_nll"].as_f64().unwrap() - cpu["mean_nll"].as_f64().unwrap()).abs();
    assert!(nll < NLL_ABS, "{arch} int4={int4}: mean NLL differs by {nll:e}");
    eprintln!("{arch} int4={int4}: logits rel L2 {rel:.2e}, NLL diff {nll:.2e}");
    assert!(cpu.get("device").is_none(), "the CPU backend reports no device copies: {cpu}");
    let weights = &gpu["device"]["transfers"]["weights"];
    assert!(weights["h2d_count"].as_u64().unwrap() > 0 && weights["d2h_count"] == 0, "{gpu}");
    assert!(gpu["device"]["launches"].as_u64().unwrap() > 0, "{gpu}");
    // The residual stream stays on the device from the embedding to the logits: one upload, one logits download
    // per chunk, no activation copy inside any decoder layer.
    let activations = &gpu["device"]["transfers"]["activations"];
    let (h2d, d2h) = (activations["h2d_count"].as_u64().unwrap(), activations["d2h_count"].as_u64().unwrap());
    assert_eq!((h2d, d2h), (1, 2), "{arch} int4={int4}: activation copies {activations}");
    eprintln!("{arch} int4={int4}: device {}", gpu["device"]);
}

#[test]
fn eval_on_the_cuda_backend_matches_the_cpu_kimi_k2() {
    eval_matches_cpu("kimi-k2", false);
}

#[test]
fn eval_on_the_cuda_backend_matches_the_cpu_glm5_int4() {
    // INT4 weights: the linear layers go through the W4A16 kernels reading weight_packed/weight_scale.
    eval_matches_cpu("glm5", true);
}

#[test]
fn eval_on_the_cuda_backend_matches_the_cpu_glm45() {
    eval_matches_cpu("glm45", false);
}

/// INT4 tiny model with 8 routed experts: `eval` on the emulated device matches the CPU.
fn int4_eval_with_grouped_experts_matches_cpu(arch: &str) {
    const HIDDEN: usize = 96;
    const INNER: usize = 64;
    let dir = tempfile::tempdir().unwrap();
    let fp8 = synth(
        dir.path(),
        "fp8",
        arch,
        &["--layers", "2", "--hidden", "96", "--experts", "8", "--moe-intermediate", "64", "--vocab", "260"],
    );
    let model = dir.path().join("int4");
    squeeze(&["quantize", path_str(&fp8), path_str(&model)]).ok();
    // The experts must be readable by the grouped kernel (a group size dividing hidden and inner), or this test
    // would only exercise the dense fallback.
    let config: Value = serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
    let group_size = config["quantization_config"]["config_groups"]
        .as_object()
        .and_then(|groups| groups.values().find_map(|g| g["weights"]["group_size"].as_u64()))
        .expect("an INT4 group size in config.json") as usize;
    assert!(HIDDEN.is_multiple_of(group_size) && INNER.is_multiple_of(group_size), "group size {group_size}");

    let (cpu_logits, gpu_logits) = (dir.path().join("cpu.safetensors"), dir.path().join("gpu.safetensors"));
    let cpu = eval(&model, "cpu", &cpu_logits);
    let gpu = eval(&model, "emulated", &gpu_logits);
    assert!(gpu["backend"].as_str().unwrap().starts_with("cuda: emulated"), "{gpu}");
    assert_eq!(cpu["backend"], "cpu");
    let (got, want) = (read_logits(&gpu_logits), read_logits(&cpu_logits));
    let squeeze::metrics::Errors { rel_l2: rel, max_abs, .. } = squeeze::metrics::errors(&got, &want);
    eprintln!("{arch} int4 8 experts: logits rel L2 {rel:.2e}, max abs {max_abs:.2e}");
    assert!(rel < LOGITS_REL_L2, "{arch}: logits rel L2 {rel:e}");
}

#[test]
fn int4_eval_with_grouped_experts_matches_the_cpu_glm5() {
    int4_eval_with_grouped_experts_matches_cpu("glm5");
}

#[test]
fn int4_eval_with_grouped_experts_matches_the_cpu_kimi_k2() {
    int4_eval_with_grouped_experts_matches_cpu("kimi-k2");
}

#[test]
fn calibration_and_parity_on_the_cuda_backend_match_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let fp8 = synth(dir.path(), "fp8", "glm5", &SMALL);
    let int4 = dir.path().join("int4");
    squeeze(&["quantize", path_str(&fp8), path_str(&int4)]).ok();
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/eval/sonnets.txt");
    let calibrate = |device: &str| {
        squeeze(&[
            "calibrate-kv",
            path_str(&int4),
            "--data",
            text,
            "--seq-len",
            "24",
            "--samples",
            "2",
            "--dry-run",
            "--json",
            "--device",
            device,
        ])
        .ok()
        .json()
    };
    let (cpu, gpu) = (calibrate("cpu"), calibrate("emulated"));
    let scales = |report: &Value| -> Vec<f64> {
        report["layers"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|l| l["k_scale"].as_array().unwrap().clone())
            .map(|v| v.as_f64().unwrap())
            .collect()
    };
    let (cpu_scales, gpu_scales) = (scales(&cpu), scales(&gpu));
    assert_eq!(cpu_scales.len(), gpu_scales.len());
    assert!(!cpu_scales.is_empty());
    for (c, g) in cpu_scales.iter().zip(&gpu_scales) {
        assert!((c - g).abs() <= SCALE_REL * c.abs(), "k_scale cpu {c} vs emulated {g}");
    }

    let parity = |device: &str| {
        squeeze(&[
            "eval",
            "--reference",
            path_str(&fp8),
            "--candidate",
            path_str(&int4),
            "--data",
            text,
            "--ctx",
            "24",
            "--chunks",
            "2",
            "--max-mean-kld",
            "100",
            "--min-same-top",
            "0",
            "--max-ppl-ratio",
            "100",
            "--json",
            "--device",
            device,
        ])
        .ok()
        .json()
    };
    let (cpu, gpu) = (parity("cpu"), parity("emulated"));
    let (cpu_modes, gpu_modes) = (cpu["modes"].as_object().unwrap(), gpu["modes"].as_object().unwrap());
    assert_eq!(cpu_modes.len(), 4, "{cpu}");
    for (mode, c) in cpu_modes {
        let g = &gpu_modes[mode];
        let (c_ppl, g_ppl) = (c["ppl"].as_f64().unwrap(), g["ppl"].as_f64().unwrap());
        assert!((c_ppl - g_ppl).abs() <= 1e-4 * c_ppl, "{mode} ppl: cpu {c_ppl} vs emulated {g_ppl}");
        // FP8 KV modes: a value that moves by summation order can round to the neighbouring FP8 code, so the
        // KLD (itself ~1e-3 here) is compared loosely.
        let (c_kld, g_kld) = (c["mean_kld"].as_f64().unwrap(), g["mean_kld"].as_f64().unwrap());
        assert!(
            (c_kld - g_kld).abs() <= PARITY_KLD_REL * c_kld + 1e-6,
            "{mode} mean KLD: cpu {c_kld} vs emulated {g_kld}"
        );
        eprintln!("{mode}: ppl {c_ppl} vs {g_ppl}, mean KLD {c_kld:e} vs {g_kld:e}");
    }
}

#[test]
fn serve_test_on_the_cuda_backend_decodes_like_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "fp8", "glm45", &SMALL);
    let serve = |device: &str| {
        squeeze(&[
            "serve-test",
            path_str(&model),
            "--prompt",
            "Shall I compare thee",
            "--prompt",
            "to a summer's day?",
            "--max-new-tokens",
            "6",
            "--json",
            "--device",
            device,
        ])
        .ok()
        .json()
    };
    let (cpu, gpu) = (serve("cpu"), serve("emulated"));
    let tokens = |report: &Value| -> Vec<Value> {
        report["requests"].as_array().unwrap().iter().map(|r| r["token_ids"].clone()).collect()
    };
    assert_eq!(tokens(&cpu), tokens(&gpu), "greedy tokens differ between cpu and emulated");
    // The decode steps' share of the device counters: part of the whole run's, absent on the CPU.
    assert!(cpu.get("decode_device").is_none(), "{cpu}");
    let (whole, decode) = (&gpu["device"], &gpu["decode_device"]);
    let launches = |counters: &Value| counters["launches"].as_u64().unwrap();
    assert!(0 < launches(decode) && launches(decode) < launches(whole), "decode {decode} of {whole}");
    eprintln!("{} decode steps: {decode}", gpu["decode_steps"]);
}

#[test]
fn unusable_devices_are_errors_naming_the_remedy() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "fp8", "glm45", &SMALL);
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/eval/sonnets.txt");
    if !cfg!(feature = "cuda") {
        let run = squeeze(&["eval", path_str(&model), "--data", text, "--ctx", "16", "--device", "cuda"]);
        assert_eq!(run.code, 2, "{}", run.stderr);
        assert!(run.stderr.contains("built without CUDA"), "{}", run.stderr);
    }
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_squeeze"))
        .args(["eval", path_str(&model), "--data", text, "--ctx", "16", "--device", "emulated"])
        .env("SQUEEZE_KERNELS_DIR", dir.path().join("no-kernels-here"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no-kernels-here") && stderr.contains("SQUEEZE_KERNELS_DIR"), "{stderr}");
}

#[test]
fn selftest_on_the_emulated_device_runs_the_op_table() {
    // The same library self-test scripts/gpu-check.sh runs with --device cuda; tests/integration/device_ops.rs runs
    // every case of its table, here the command runs the cheap ones (`--op` selects by name).
    let report =
        squeeze(&["selftest", "--device", "emulated", "--seed", "3", "--op", "norm,rope,route", "--json"]).ok().json();
    let rows = report["rows"].as_array().unwrap();
    let ops: std::collections::BTreeSet<&str> = rows.iter().map(|row| row["op"].as_str().unwrap()).collect();
    for op in ["rms_norm", "layer_norm", "rope Interleaved", "rope Half", "route grouped top-k"] {
        assert!(ops.contains(op), "self-test lacks {op}: {ops:?}");
    }
    assert!(rows.iter().all(|row| row["passed"] == true), "{report}");
    assert_eq!(report["passed"], true);
    let copied = &report["device"]["transfers"]["activations"];
    assert!(copied["h2d_count"].as_u64().unwrap() > 0 && copied["d2h_count"].as_u64().unwrap() > 0, "{report}");
    assert!(report["device"]["launches"].as_u64().unwrap() > 0, "{report}");
}

#[test]
fn gpu_check_script_passes_its_rehearsal_on_the_emulated_device() {
    // scripts/gpu-check.sh is what a session lent a GPU runs, once, inside 15 minutes of device time; its rehearsal
    // runs every default step of it (self-test, GPTQ's pass, runtime cpu vs device, layer-streamed eval, byte
    // identity, end-to-end quantize) on the emulated device at toy sizes, so a renamed flag or a broken step shows here, not there.
    let dir = tempfile::tempdir().unwrap();
    let output = std::process::Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/gpu-check.sh"))
        .args([env!("CARGO_BIN_EXE_squeeze"), path_str(dir.path())])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("REHEARSE", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let log = format!("{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(0), "{log}");
    let summary = stdout.split("== summary").nth(1).unwrap_or_else(|| panic!("no summary: {log}"));
    for step in ["device", "selftest", "gptq", "runtime", "layer_stream", "byte_identity", "end_to_end"] {
        let line = summary.lines().find(|line| line.starts_with(step)).unwrap_or_else(|| panic!("{step}: {log}"));
        assert!(line.contains("passed"), "{line}\n{log}");
    }
    for evidence in [
        "all kernels match the CPU path",
        "gptq_algebra device",
        "serve-test greedy tokens: identical",
        "per layer",
        "quantize mse",
    ] {
        assert!(stdout.contains(evidence), "no `{evidence}` in the log:\n{log}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the script left its work folder behind");
}
