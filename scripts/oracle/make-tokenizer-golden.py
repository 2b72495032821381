#!/usr/bin/env python3
"""Write tests/golden/tokenizer/{hf,kimi}/: two tiny tokenizers and the ids Python gives for a fixed text.

Usage (from the repository root, after scripts/oracle/setup-venv.sh and `.venv-oracle/bin/pip install tiktoken`):

    .venv-oracle/bin/python scripts/oracle/make-tokenizer-golden.py [--out tests/golden/tokenizer]

hf/    tokenizer.json        byte-level BPE (vocab 600: 3 specials, 256 bytes, 341 merges) trained here with the `tokenizers` library on TRAIN_TEXT
       tokenizer_config.json PreTrainedTokenizerFast with three added special tokens
       ids.json              {"text", "ids"}: TEST_TEXT wrapped in chat specials, encoded without adding
                             anything (add_special_tokens=False); the `tokenizers` library and transformers'
                             AutoTokenizer must agree, and decoding must give the text back.
kimi/  tiktoken.model        `base64(token bytes) rank` lines: the same learned vocabulary, ranks in merge order
       tokenizer_config.json Kimi-style `added_tokens_decoder` (Kimi K2's special names at Kimi's offsets past
                             the mergeable ranks; 256 reserved ids, unnamed ones `<|reserved_token_{id}|>`)
       ids.json              {"text", "ids"}: TEST_TEXT wrapped in Kimi chat specials (and one reserved token),
                             encoded by the `tiktoken` library with Kimi's pat_str and every special allowed,
                             exactly as tokenization_kimi.py builds its tiktoken.Encoding.

Kimi's pat_str is read from src/model/tokenizer.rs (KIMI_PATTERN) so the golden uses the very string the Rust
code uses; the script asserts it equals the pattern of Kimi K2's tokenization_kimi.py (copied below).

Cross-check of the pre-tokenizer: Python's `regex` module needs VERSION1 mode (`(?V1)`) for the class
intersection `&&[^\\p{Han}]` (in the default VERSION0 mode `&&` is not an intersection and the letter branches
match nothing). The script splits the body with `regex` V1 and asserts that encoding piece by piece gives the
same ids as tiktoken (whose regex is the Rust `fancy-regex` crate).

Deterministic: rerunning gives byte-identical files.
"""

import argparse
import base64
import json
import pathlib
import re
import sys

import regex
import tiktoken
import tokenizers
import transformers
from tokenizers import decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Public-domain training text: US Constitution, Shakespeare, the Analects, the 1789 Declaration, plus
# some mixed scripts, emoji, digits and whitespace runs.
TRAIN_TEXT = """\
We the People of the United States, in Order to form a more perfect Union, establish Justice, insure
domestic Tranquility, provide for the common defence, promote the general Welfare, and secure the
Blessings of Liberty to ourselves and our Posterity, do ordain and establish this Constitution for the
United States of America.

Article. I. Section. 1. All legislative Powers herein granted shall be vested in a Congress of the
United States, which shall consist of a Senate and House of Representatives.

Shall I compare thee to a summer's day? Thou art more lovely and more temperate:
Rough winds do shake the darling buds of May, And summer's lease hath all too short a date.
To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer
The slings and arrows of outrageous fortune, Or to take arms against a sea of troubles
And by opposing end them. To die: to sleep; No more; and by a sleep to say we end
The heart-ache and the thousand natural shocks That flesh is heir to, 'tis a consummation
Devoutly to be wish'd. I'LL be there; you'RE late; they've gone; we'd see; I'm here.

学而时习之，不亦说乎？有朋自远方来，不亦乐乎？人不知而不愠，不亦君子乎？
中文English混合，English中文混合。数字：2024年12月31日。

Les hommes naissent et demeurent libres et égaux en droits. Les distinctions sociales ne peuvent
être fondées que sur l'utilité commune. Déclaration des droits de l'homme et du citoyen, 1789.
Über allen Gipfeln ist Ruh'. Señor, ¿dónde está la estación? Ça va très bien, merci.

Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 1000 31415926 2.71828 -17 +3 1,000,000
Emoji: 😀 🎉 🚀 ❤️ 👍🏽
Whitespace:    four spaces,\ttab,\t\ttwo tabs,
blank lines


and trailing spaces   
"""

# The fixed test text (different from the training text). Its characters include ones never seen in training,
# decomposed accents (e + U+0301), ZWJ emoji, flags, CR LF, tabs, runs of spaces and upper-case contractions.
TEST_TEXT = """\
Four score and seven years ago our fathers brought forth on this continent, a new nation, conceived in
Liberty, and dedicated to the proposition that all men are created equal. WE'LL see; It'S fine; they'VE left.
Größe, naïve café, façade, cre\u0301me bru\u0302le\u0301e; Καλημέρα κόσμε; Привет, мир!
用Rust写tokenizer很有趣，中文English混合测试。こんにちは世界、カタカナ。한국어 텍스트.
Emoji: 👨\u200d👩\u200d👧 🇫🇷 🇯🇵 ✔️ 🤖🤖 — digits 1234567 3.14159 0x7F 2026-05-01.
Tabs:\tone\t\ttwo; spaces:     five;\r\nCRLF line\r\n\r\n   leading and trailing   
  \n"""

HF_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
HF_TEXT = "<|im_start|>user\n" + TEST_TEXT + "<|im_end|><|im_start|>assistant\nOK.<|im_end|><|endoftext|>"

# Kimi K2's tokenizer_config.json specials: offset past the mergeable ranks -> content.
KIMI_SPECIALS = {
    0: "[BOS]",
    1: "[EOS]",
    2: "<|im_end|>",
    3: "<|im_user|>",
    4: "<|im_assistant|>",
    6: "<|start_header_id|>",
    7: "<|end_header_id|>",
    9: "[EOT]",
    10: "<|im_system|>",
    17: "<|im_middle|>",
    254: "[UNK]",
    255: "[PAD]",
}
KIMI_RESERVED = 256

# pat_str of Kimi K2's tokenization_kimi.py.
KIMI_PAT_STR = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)


def rust_kimi_pattern() -> str:
    """KIMI_PATTERN from src/model/tokenizer.rs: the raw string literals inside its concat!."""
    source = (ROOT / "src/model/tokenizer.rs").read_text()
    block = re.search(r"pub const KIMI_PATTERN: &str = concat!\((.*?)\n\);", source, re.S)
    if not block:
        sys.exit("KIMI_PATTERN not found in src/model/tokenizer.rs")
    parts = re.findall(r'r"(.*?)",?\s*$', block.group(1), re.M)
    return "".join(parts)


def dump(path: pathlib.Path, value, indent=1) -> None:
    path.write_text(json.dumps(value, ensure_ascii=False, indent=indent) + "\n", encoding="utf-8")


def write_hf(out: pathlib.Path) -> tokenizers.Tokenizer:
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        min_frequency=1,
        special_tokens=HF_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TRAIN_TEXT], trainer=trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": {
            str(tok.token_to_id(s)): {
                "content": s,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for s in HF_SPECIALS
        },
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
    }
    dump(out / "tokenizer_config.json", config)

    # The saved file, reloaded, through both Python front ends.
    loaded = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    ids = loaded.encode(HF_TEXT, add_special_tokens=False).ids
    auto = AutoTokenizer.from_pretrained(str(out))
    auto_ids = auto.encode(HF_TEXT, add_special_tokens=False)
    assert ids == auto_ids, f"tokenizers {ids} != AutoTokenizer {auto_ids}"
    assert loaded.decode(ids, skip_special_tokens=False) == HF_TEXT, "tokenizers decode does not round-trip"
    assert auto.decode(auto_ids, skip_special_tokens=False) == HF_TEXT, "AutoTokenizer decode does not round-trip"
    for s in HF_SPECIALS:
        assert ids.count(loaded.token_to_id(s)) == HF_TEXT.count(s), s
    dump(out / "ids.json", {"text": HF_TEXT, "ids": ids}, indent=None)
    print(f"hf: vocab {loaded.get_vocab_size()}, {len(ids)} ids")
    return loaded


def byte_level_decoder() -> dict:
    """The GPT-2 byte <-> unicode map used by the ByteLevel pre-tokenizer, reversed."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def write_kimi(out: pathlib.Path, hf: tokenizers.Tokenizer) -> None:
    pattern = rust_kimi_pattern()
    assert pattern == KIMI_PAT_STR, f"src/model/tokenizer.rs KIMI_PATTERN differs from Kimi's pat_str:\n{pattern}"

    # Mergeable ranks: the learned byte-level vocabulary without the specials, in id order (single bytes
    # first, then tokens in merge order), renumbered from 0.
    unmap = byte_level_decoder()
    vocab = hf.get_vocab(with_added_tokens=False)
    ranks = {}
    for token, _ in sorted(vocab.items(), key=lambda kv: kv[1]):
        if token in HF_SPECIALS:
            continue
        ranks[bytes(unmap[c] for c in token)] = len(ranks)
    assert all(bytes([b]) in ranks for b in range(256))
    base = len(ranks)

    specials = {KIMI_SPECIALS.get(i, f"<|reserved_token_{base + i}|>"): base + i for i in range(KIMI_RESERVED)}
    enc = tiktoken.Encoding(name="kimi-golden", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)

    reserved = f"<|reserved_token_{base + 5}|>"
    text = (
        "[BOS]<|im_system|>system<|im_middle|>You are Kimi.<|im_end|>"
        "<|im_user|>user<|im_middle|>" + TEST_TEXT + "<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|>OK." + reserved + "<|im_end|>[EOS]"
    )
    ids = enc.encode(text, allowed_special="all")
    assert enc.decode(ids) == text, "tiktoken decode does not round-trip"
    for name in list(KIMI_SPECIALS.values()) + [reserved]:
        assert ids.count(specials[name]) == text.count(name), name

    # Pre-tokenizer cross-check with Python's `regex` (VERSION1 for `&&`).
    pieces = regex.findall("(?V1)" + pattern, TEST_TEXT)
    assert "".join(pieces) == TEST_TEXT
    by_piece = [i for p in pieces for i in enc.encode_ordinary(p)]
    assert by_piece == enc.encode_ordinary(TEST_TEXT), "regex (V1) split differs from tiktoken's fancy-regex split"
    assert regex.findall(pattern, "Déf") != regex.findall("(?V1)" + pattern, "Déf")  # V0 misreads `&&`

    out.mkdir(parents=True, exist_ok=True)
    lines = [f"{base64.b64encode(t).decode()} {r}\n" for t, r in sorted(ranks.items(), key=lambda kv: kv[1])]
    (out / "tiktoken.model").write_text("".join(lines))
    config = {
        "tokenizer_class": "TikTokenTokenizer",
        "added_tokens_decoder": {
            str(base + i): {
                "content": s,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for i, s in sorted(KIMI_SPECIALS.items())
        },
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "model_max_length": 4096,
    }
    dump(out / "tokenizer_config.json", config)
    dump(out / "ids.json", {"text": text, "ids": ids}, indent=None)
    print(f"kimi: {base} mergeable ranks + {KIMI_RESERVED} specials, {len(ids)} ids")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "tests/golden/tokenizer")
    args = parser.parse_args()
    print(f"tokenizers {tokenizers.__version__}, transformers {transformers.__version__}, tiktoken {tiktoken.__version__}")
    hf = write_hf(args.out / "hf")
    write_kimi(args.out / "kimi", hf)


if __name__ == "__main__":
    main()
