#!/usr/bin/env python3
"""Write eval/tempest-tasks.jsonl, the task file `squeeze demo` and the tests run (`eval --task`), from the
public-domain text of The Tempest that the tiny Shakespeare model never saw (eval/shakespeare-heldout.txt) and a
few arithmetic word problems written here. Deterministic (random.Random(0)); standard library only.

Usage: python3 scripts/make-task-file.py [--out eval/tempest-tasks.jsonl]

Tasks:
  tempest-next-line    multiple choice: a speaker's name and up to three lines of the speech; which of four lines
                       comes next (the true one and three from other speeches of the play). 40 items, 3 few-shot.
  tempest-next-word    multiple choice: a speech up to the last word of one of its lines; which of four words ends
                       it (the true one and three other words of the play). Up to 40 items, 3 few-shot.
  tempest-arithmetic   generation: one-step word problems, the number extracted by regex `(-?\\d+)` from the
                       completion up to a newline. 6 items, 2 few-shot.
"""

import argparse
import json
import pathlib
import random
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
SPEAKER = re.compile(r"^([A-Z][A-Z ]*[A-Z])\.$")

ARITHMETIC = [
    ("Prospero has 3 books and Gonzalo gives him 4 more. How many books has he?", "7"),
    ("Ariel serves 12 years and is freed after 2 more. How many years in all?", "14"),
    ("Stephano has 9 bottles and drinks 5. How many are left?", "4"),
    ("Caliban carries 6 logs, then 6 more. How many logs?", "12"),
    ("A ship holds 20 sailors and 8 go ashore. How many stay aboard?", "12"),
    ("Miranda counts 5 waves, then 10 more. How many waves?", "15"),
    ("Trinculo finds 2 cloaks and Stephano 3. How many cloaks?", "5"),
    ("Ferdinand piles 30 logs and carries away 10. How many remain?", "20"),
]


def speeches(text):
    """(speaker, lines) of every speech: a line `NAME.` followed by its lines up to a blank line."""
    out, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        match = SPEAKER.match(lines[i].strip())
        if match:
            body = []
            i += 1
            while i < len(lines) and lines[i].strip():
                body.append(lines[i].rstrip())
                i += 1
            if body:
                out.append((match.group(1), body))
        else:
            i += 1
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "eval" / "tempest-tasks.jsonl"))
    args = parser.parse_args()
    text = (ROOT / "eval" / "shakespeare-heldout.txt").read_text(encoding="utf-8")
    all_speeches = speeches(text)
    rng = random.Random(0)
    items = []

    # Next line: speeches of at least 4 lines; the context is the name and the first lines, the answer the next.
    long = [s for s in all_speeches if len(s[1]) >= 4]
    picked = rng.sample(range(len(long)), 43)
    pool = [line for _, body in all_speeches for line in body if len(line) > 20]
    for n, index in enumerate(picked):
        speaker, body = long[index]
        cut = rng.randint(1, min(3, len(body) - 1))
        context = speaker + ".\n" + "\n".join(body[:cut]) + "\n"
        answer = body[cut]
        others = [line for line in rng.sample(pool, 12) if line not in body][:3]
        choices = others + [answer]
        rng.shuffle(choices)
        item = {"task": "tempest-next-line", "context": context, "choices": choices, "gold": choices.index(answer)}
        if n < 3:
            item["fewshot"] = True
        items.append(item)

    # Next word: a speech up to the last word of one of its lines; which of four words ends the line.
    spoken = (w for _, body in all_speeches for line in body for w in re.findall(r"[A-Za-z']+", line))
    words = sorted({w for w in spoken if len(w) > 3})
    candidates = [s for s in all_speeches if any(len(re.findall(r"[A-Za-z']+", l)) >= 4 for l in s[1])]
    for n, index in enumerate(rng.sample(range(len(candidates)), 43)):
        speaker, body = candidates[index]
        lines = [k for k, line in enumerate(body) if re.search(r" [A-Za-z']{4,}[,.;:!?]?$", line)]
        if not lines:
            continue
        k = rng.choice(lines)
        head, last = body[k].rsplit(" ", 1)
        answer = re.match(r"[A-Za-z']+", last).group(0)
        context = speaker + ".\n" + "".join(line + "\n" for line in body[:k]) + head
        choices = [w for w in rng.sample(words, 8) if w.lower() != answer.lower()][:3] + [answer]
        rng.shuffle(choices)
        item = {"task": "tempest-next-word", "context": context, "choices": choices, "gold": choices.index(answer)}
        if n < 3:
            item["fewshot"] = True
        items.append(item)

    for n, (question, answer) in enumerate(ARITHMETIC):
        item = {
            "task": "tempest-arithmetic",
            "context": f"Question: {question}\nAnswer:",
            "target": answer,
            "until": ["\n"],
            "regex": r"(-?\d+)",
            "max_tokens": 8,
        }
        if n < 2:
            item["fewshot"] = True
        items.append(item)

    with open(args.out, "w", encoding="utf-8") as out:
        for item in items:
            out.write(json.dumps(item, ensure_ascii=False) + "\n")
    print(f"{args.out}: {len(items)} lines")


if __name__ == "__main__":
    main()
