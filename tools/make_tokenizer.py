#!/usr/bin/env python3
"""Builds a tiny tokenizer.json for the smollm2-tiny-bf16 fixture and what
`ktune run --prompt` must print for it.

The tokenizer is shaped like SmolLM2's: byte-level BPE (GPT-2 regex, so the
Rust side needs fancy-regex), single digits split off first, no prefix space,
the byte-level decoder, and three special tokens at ids 0, 1, 2
(<|endoftext|>, <|im_start|>, <|im_end|>: the fixture's pad, bos and eos).
256 byte tokens plus merges learned from a few sentences fill exactly the
fixture's 320-token vocabulary.

Written into tests/fixtures/smollm2-tiny-bf16/:

    tokenizer.json            the tokenizer
    tokenizer_expected.json   prompt          the text given to --prompt
                              prompt_ids      tokenizer.encode(prompt).ids
                              max_tokens      how many ids to generate
                              generated       greedy ids from transformers (f32, eager,
                                              KV cache, end-of-sequence ignored)
                              text            tokenizer.decode(generated,
                                              skip_special_tokens=True)

Run after tools/make_fixtures.py (which keeps these two files when it rewrites
the fixture), with torch, transformers and tokenizers from PyPI:

    /tmp/fx/bin/python tools/make_tokenizer.py           # writes the files
    /tmp/fx/bin/python tools/make_tokenizer.py --check   # recomputes, compares, writes nothing
"""

import argparse
import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GenerationConfig, LlamaForCausalLM

FIXTURE = "smollm2-tiny-bf16"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A kernel reads the weights once for every token it decodes.",
    "Tuning picks the fastest kernel for each slot of the plan.",
    "Memory bandwidth bounds the decode speed of a small model.",
    "In 2025 the model ran at 123 tokens per second on 2 cores.",
    "Café, naïve, résumé: bytes that are not ASCII still round-trip.",
    "the the the and and of of to to in in is is it it on on",
]
PROMPT = "The kernel reads 42 weights in the café."
MAX_TOKENS = 4
# Smallest gap between the two largest logits of a greedy step (as in make_fixtures.py).
MIN_MARGIN = 0.01


def build_tokenizer(vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        sys.exit(f"trained vocabulary has {tok.get_vocab_size()} tokens, the fixture {vocab_size}: change the corpus")
    for i, s in enumerate(SPECIALS):
        if tok.token_to_id(s) != i:
            sys.exit(f"special token {s} got id {tok.token_to_id(s)}, expected {i}")
    return tok


def greedy(model_dir, prompt_ids):
    model = LlamaForCausalLM.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32).eval()
    tokens = torch.tensor([prompt_ids])
    cfg = GenerationConfig(do_sample=False, max_new_tokens=MAX_TOKENS, eos_token_id=None, pad_token_id=0, bos_token_id=None)
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(
            tokens,
            attention_mask=torch.ones_like(tokens),
            generation_config=cfg,
            output_logits=True,
            return_dict_in_generate=True,
            use_cache=True,
        )
    generated = out.sequences[0, len(prompt_ids) :].tolist()
    top2 = torch.stack([l[0] for l in out.logits]).topk(2, dim=1).values
    margin = float((top2[:, 0] - top2[:, 1]).min())
    if margin < MIN_MARGIN:
        sys.exit(f"greedy choice too close to call (top-2 margin {margin:.4f}): change the prompt")
    return generated


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "tests" / "fixtures"))
    ap.add_argument("--check", action="store_true", help="recompute and compare with the files, write nothing")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    d = Path(args.out) / FIXTURE
    vocab = json.loads((d / "config.json").read_text())["vocab_size"]
    tok = build_tokenizer(vocab)
    prompt_ids = tok.encode(PROMPT).ids
    # The byte-level tokenizer is lossless: the prompt must come back unchanged.
    if tok.decode(prompt_ids) != PROMPT:
        sys.exit(f"prompt does not round-trip: {tok.decode(prompt_ids)!r}")
    generated = greedy(d, prompt_ids)
    exp = {
        "about": "tools/make_tokenizer.py: `ktune run --prompt PROMPT --max-tokens MAX_TOKENS` on this fixture",
        "prompt": PROMPT,
        "prompt_ids": prompt_ids,
        "max_tokens": MAX_TOKENS,
        "generated": generated,
        "text": tok.decode(generated, skip_special_tokens=True),
    }
    text = json.dumps(exp, ensure_ascii=False, indent=1) + "\n"
    if args.check:
        old_tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        same_tok = old_tok.get_vocab() == tok.get_vocab() and old_tok.encode(PROMPT).ids == prompt_ids
        same = same_tok and (d / "tokenizer_expected.json").read_text(encoding="utf-8") == text
        print(f"{FIXTURE}: {'ok' if same else 'DIFFERENT'}")
        sys.exit(0 if same else 1)
    tok.save(str(d / "tokenizer.json"), pretty=False)
    (d / "tokenizer_expected.json").write_text(text, encoding="utf-8")
    print(f"{FIXTURE}: prompt ids {prompt_ids}, generated {generated}, text {exp['text']!r}")


if __name__ == "__main__":
    main()
