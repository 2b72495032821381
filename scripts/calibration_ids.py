"""Calibration `input_ids` [rows, columns] (I64 safetensors) that squeeze (`quantize --calibration IDS`, used as
given) and llm-compressor (scripts/llmcompressor_gptq.py) both read, so that both tools calibrate on the same ids.
Used by scripts/bench-gptq-vs-llmcompressor.sh and scripts/bench-vs-peers.sh.

    python3 scripts/calibration_ids.py random OUT ROWS COLUMNS VOCAB
        random ids below VOCAB, fixed seed (stdlib only)
    python scripts/calibration_ids.py text OUT TEXT TOKENIZER_JSON COLUMNS [MAX_ROWS]
        TEXT encoded by the `tokenizers` library with TOKENIZER_JSON (no special tokens added), cut into as many
        whole rows of COLUMNS tokens as it holds (at most MAX_ROWS); prints the row count
"""

import json
import random
import struct
import sys


def write_ids(path: str, ids: list[int], rows: int, columns: int) -> None:
    data = struct.pack(f"<{rows * columns}q", *ids[: rows * columns])
    header = json.dumps({"input_ids": {"dtype": "I64", "shape": [rows, columns], "data_offsets": [0, len(data)]}})
    header = header.encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(header)) + header + data)


def main() -> None:
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "random":
        rows, columns, vocab = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        rng = random.Random(0)
        write_ids(path, [rng.randrange(vocab) for _ in range(rows * columns)], rows, columns)
    elif mode == "text":
        from tokenizers import Tokenizer

        text, tokenizer, columns = sys.argv[3], sys.argv[4], int(sys.argv[5])
        ids = Tokenizer.from_file(tokenizer).encode(open(text, encoding="utf-8").read(), add_special_tokens=False).ids
        rows = len(ids) // columns
        if len(sys.argv) > 6:
            rows = min(rows, int(sys.argv[6]))
        if rows == 0:
            sys.exit(f"{text}: {len(ids)} tokens, fewer than one row of {columns}")
        write_ids(path, ids, rows, columns)
        print(rows)
    else:
        sys.exit(f"unknown mode {mode}: random or text")


if __name__ == "__main__":
    main()
