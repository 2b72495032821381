#!/usr/bin/env python3
"""Write tests/golden/lmeval/tempest-tasks.json: lm-evaluation-harness's own per-item results on the trained tiny
Shakespeare model (eval/tiny-shakespeare-fp8, dequantized exactly to float32) for the task file squeeze ships
(eval/tempest-tasks.jsonl), run as local tasks through the harness's HF backend, so CI checks `squeeze eval --task`
against the harness without Python.

Usage (from the repository root, after scripts/oracle/setup-venv.sh and `pip install lm-eval==0.4.13` into it):

    .venv-oracle/bin/python scripts/oracle/lmeval/make-task-golden.py [--fewshot 0,2]

For each task of the file it writes a task YAML (dataset `json` from a test file of the scored items and a train
file of the few-shot items, `fewshot_config.sampler: first_n`, default delimiters; multiple choice with `acc` and
`acc_norm`; generation with the items' `until` and `max_gen_toks`, the regex filter with `group_select: 0` and
`exact_match`), loads the float32 model with transformers (eager attention) and the model's `tokenizer.json`, and
runs `lm_eval.simple_evaluate` with `log_samples`. The golden keeps, per few-shot count and task, the harness's
metrics with their standard errors and, per item (by its line in the task file), every choice's log-likelihood
and greedy flag, or the completion and the extracted answer, and the item's metric values.
"""

import argparse
import importlib.util
import json
import os
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[3]
MODEL = ROOT / "eval" / "tiny-shakespeare-fp8"
TASKS = ROOT / "eval" / "tempest-tasks.jsonl"
GOLDEN = ROOT / "tests" / "golden" / "lmeval" / "tempest-tasks.json"


def runtime_golden_module():
    path = ROOT / "scripts" / "oracle" / "make-runtime-golden.py"
    spec = importlib.util.spec_from_file_location("runtime_golden", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def task_yaml(name, items, folder):
    """The harness's YAML for task `name` (its items in file order), its data files written under `folder`."""
    scored = [item for item in items if not item.get("fewshot")]
    fewshot = [item for item in items if item.get("fewshot")]
    for split, rows in (("test", scored), ("train", fewshot or scored[:1])):
        with open(folder / f"{name}-{split}.jsonl", "w", encoding="utf-8") as out:
            for row in rows:
                out.write(json.dumps({k: v for k, v in row.items() if k != "fewshot"}, ensure_ascii=False) + "\n")
    config = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {
            "data_files": {"test": str(folder / f"{name}-test.jsonl"), "train": str(folder / f"{name}-train.jsonl")}
        },
        "test_split": "test",
        "fewshot_split": "train",
        "fewshot_config": {"sampler": "first_n"},
        "doc_to_text": "context",
    }
    if "choices" in scored[0]:
        config.update(
            output_type="multiple_choice",
            doc_to_choice="choices",
            doc_to_target="gold",
            metric_list=[{"metric": "acc"}, {"metric": "acc_norm"}],
        )
    else:
        for key in ("until", "regex", "max_tokens"):
            values = {json.dumps(item.get(key)) for item in items}
            assert len(values) == 1, f"task {name}: the harness takes one `{key}` per task, the file has {values}"
        first = scored[0]
        config.update(
            output_type="generate_until",
            doc_to_target="target",
            generation_kwargs={
                "until": first.get("until", ["\n\n"]),
                "do_sample": False,
                "max_gen_toks": first.get("max_tokens", 256),
            },
            metric_list=[{"metric": "exact_match"}],
        )
        if first.get("regex"):
            config["filter_list"] = [
                {
                    "name": "extract",
                    "filter": [
                        {"function": "regex", "regex_pattern": first["regex"], "group_select": 0},
                        {"function": "take_first"},
                    ],
                }
            ]
    (folder / f"{name}.yaml").write_text(json.dumps(config, indent=1))
    return [item["_line"] for item in scored]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fewshot", default="0,2")
    args = parser.parse_args()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import torch
    import transformers
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    torch.manual_seed(0)
    rows = []
    for number, line in enumerate(TASKS.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            row = json.loads(line)
            row["_line"] = number
            rows.append(row)
    names = list(dict.fromkeys(row["task"] for row in rows))
    runtime = runtime_golden_module()
    with tempfile.TemporaryDirectory() as scratch:
        scratch = pathlib.Path(scratch)
        folder = scratch / "f32"
        config = json.loads((MODEL / "config.json").read_text())
        runtime.float_folder("kimi-k2", MODEL, folder, config)
        model, info = runtime.load_float("kimi-k2", folder)
        missing = [name for name in info["missing_keys"] if not name.endswith("e_score_correction_bias")]
        assert not missing and not info["unexpected_keys"], info
        model.eval()
        tokenizer = transformers.PreTrainedTokenizerFast(
            tokenizer_file=str(MODEL / "tokenizer.json"), bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>"
        )
        sample = "Thy father was the Duke of Milan,\n and"
        assert tokenizer.encode(sample, add_special_tokens=False) == list(sample.encode()), "byte-level"
        tasks_dir = scratch / "tasks"
        tasks_dir.mkdir()
        for row in rows:
            row.pop("_skip", None)
        lines = {}
        for name in names:
            items = [{k: v for k, v in row.items()} for row in rows if row["task"] == name]
            lines[name] = task_yaml(name, items, tasks_dir)
        # The YAML files are JSON (a YAML subset); the harness's loader wants the .yaml suffix.
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=1, max_length=config["max_position_embeddings"])
        golden = {
            "model": str(MODEL.relative_to(ROOT)),
            "task_file": str(TASKS.relative_to(ROOT)),
            "versions": {"lm_eval": lm_eval.__version__, "transformers": transformers.__version__,
                         "torch": torch.__version__},
            "runs": [],
        }
        for fewshot in [int(k) for k in args.fewshot.split(",")]:
            results = lm_eval.simple_evaluate(
                model=lm,
                tasks=names,
                num_fewshot=fewshot,
                task_manager=TaskManager(include_path=str(tasks_dir)),
                log_samples=True,
                random_seed=0,
                numpy_random_seed=0,
                torch_random_seed=0,
                fewshot_random_seed=0,
            )
            run = {"num_fewshot": fewshot, "tasks": []}
            for name in names:
                metrics = {}
                for key, value in results["results"][name].items():
                    if key == "alias":
                        continue
                    metric, _, _filter = key.partition(",")
                    metrics[metric] = value
                items = []
                for sample in sorted(results["samples"][name], key=lambda s: s["doc_id"]):
                    item = {"line": lines[name][sample["doc_id"]]}
                    if "choices" in sample["doc"]:
                        item["loglikelihoods"] = [float(r[0][0]) for r in sample["resps"]]
                        item["greedy"] = [bool(r[0][1]) for r in sample["resps"]]
                        item["acc"] = sample["acc"]
                        item["acc_norm"] = sample["acc_norm"]
                    else:
                        item["completion"] = sample["resps"][0][0]
                        item["answer"] = sample["filtered_resps"][0]
                        item["exact_match"] = sample["exact_match"]
                    items.append(item)
                run["tasks"].append({"task": name, "metrics": metrics, "items": items})
            golden["runs"].append(run)
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n")
    print(f"{GOLDEN.relative_to(ROOT)}: {sum(len(t['items']) for r in golden['runs'] for t in r['tasks'])} items")


if __name__ == "__main__":
    sys.exit(main())
