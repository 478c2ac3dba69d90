#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = [
#     "gguf==0.19.0",
#     "jinja2==3.1.6",
#     "numpy==2.4.6",
#     "protobuf==7.36.2",
#     "sentencepiece==0.2.3",
#     "tokenizers==0.23.3",
#     "transformers==5.23.0",
# ]
# ///
"""Builds small SentencePiece GGUF files (tokenizer metadata only, no tensors)
in tests/fixtures/spm/ and what ktune must encode and decode with them.

A SentencePiece BPE model with byte fallback is trained on a few sentences
(sentencepiece itself), and written into a GGUF the way llama.cpp's
convert_hf_to_gguf.py `_create_vocab_sentencepiece` writes it: every piece,
its score, its type (1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte),
the special token ids, add_bos/add_eos/add_space_prefix, and a chat template.

    gemma3.gguf          architecture gemma3, Gemma's token layout (<pad> <eos>
                         <bos> <unk> <mask>, <start_of_turn>, <end_of_turn> control,
                         <tool_call> user-defined), add_space_prefix false,
                         Gemma 3's chat template
    llama.gguf           architecture llama, Llama 2's layout (<unk> <s> </s>),
                         add_space_prefix true
    llama-noprefix.gguf  the same vocabulary, add_space_prefix false

The expected ids (NAME.json) come from transformers loading each GGUF file
(`GemmaTokenizer` / `LlamaTokenizer.from_pretrained(dir, gguf_file=...)`, the
class AutoTokenizer picks for the architecture): `encode(text)` (special
tokens added as the file says) and `decode(ids, skip_special_tokens=True)`,
and for the Gemma file `apply_chat_template` of one user turn.

    python3 -m venv target/venv-tok
    target/venv-tok/bin/pip install gguf==0.19.0 jinja2==3.1.6 numpy==2.4.6 protobuf==7.36.2 \
        sentencepiece==0.2.3 tokenizers==0.23.3 transformers==5.23.0
    target/venv-tok/bin/python tools/make_spm_gguf.py           # writes tests/fixtures/spm/
    target/venv-tok/bin/python tools/make_spm_gguf.py --check   # recomputes, compares, writes nothing
"""

import argparse
import json
import re
import sys
import tempfile
import types
from pathlib import Path

import sentencepiece as spm
import transformers
from gguf import GGUFWriter, TokenType
from tokenizers import decoders, pre_tokenizers
from transformers import GemmaTokenizer, LlamaTokenizer


def stub_torch():
    """transformers' GGUF metadata reader imports torch at module level but reads
    tokenizer metadata without it; CPU torch wheels are not always installable,
    so when torch is missing an empty stand-in module is registered (after
    transformers itself was imported and found no torch)."""
    try:
        import torch  # noqa: F401
    except ImportError:

        class Stub(types.ModuleType):
            def __getattr__(self, name):
                if name.startswith("__"):
                    raise AttributeError(name)
                value = type(name, (), {"__init__": lambda self, *a, **k: None})
                setattr(self, name, value)
                return value

        sys.modules["torch"] = Stub("torch")
        sys.modules["torch.nn"] = sys.modules["torch"].nn = Stub("torch.nn")


# The tokenizer class AutoTokenizer picks for each architecture (from the
# config's model_type); loading it with gguf_file= is what AutoTokenizer does
# after building the config (which needs torch).
TOKENIZER_CLASS = {"gemma3": GemmaTokenizer, "llama": LlamaTokenizer}

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "spm"
TEMPLATES = ROOT / "tests" / "fixtures" / "chat_templates"

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A kernel reads the weights once for every token it decodes.",
    "Tuning picks the fastest kernel for each slot of the plan.",
    "Memory bandwidth bounds the decode speed of a small model.",
    "In 2025 the model ran at 123 tokens per second on 2 cores.",
    "Café, naïve, résumé: bytes that are not ASCII still round-trip.",
    "the the the and and of of to to in in is is it it on on",
    "Hello, how are you? I am fine, thank you.",
    "    indented code with four spaces and a tab\tcolumn",
]

TEXTS = [
    "The kernel reads 42 weights in the café.",
    "Hello world",
    " leading space",
    "  two leading spaces, trailing two  ",
    "a crab 🦀 and 漢字 are outside the vocabulary",
    "line one\nline two\n\nend",
    "tabs\tand    runs of spaces",
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "<bos>Hello<eos>",
    "call <tool_call> now",
    "",
    " ",
    "Zürich ß ÆØÅ ñ",
]

# sentencepiece trainer settings per layout.
LAYOUTS = {
    "gemma": dict(
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        pad_piece="<pad>",
        eos_piece="<eos>",
        bos_piece="<bos>",
        unk_piece="<unk>",
        control_symbols=["<mask>", "<start_of_turn>", "<end_of_turn>"],
        user_defined_symbols=["<tool_call>"],
        add_dummy_prefix=False,
        vocab_size=420,
    ),
    "llama": dict(
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        add_dummy_prefix=True,
        vocab_size=400,
    ),
}

# The prompt of the rendered chat templates, and the special tokens each renders with.
CHAT_PROMPT = "  What is 2+2?  "
CHAT_SPECIALS = {
    "gemma3": {"bos_token": "<bos>", "eos_token": "<eos>"},
    "llama3.2": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "qwen2.5": {"bos_token": None, "eos_token": "<|im_end|>"},
    "smollm2": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"},
}

FILES = [
    # name, architecture, layout, add_space_prefix, chat template file
    ("gemma3", "gemma3", "gemma", False, "gemma3.jinja"),
    ("llama", "llama", "llama", True, None),
    ("llama-noprefix", "llama", "llama", False, None),
]


def train(layout, workdir):
    prefix = str(Path(workdir) / layout)
    corpus = Path(workdir) / "corpus.txt"
    corpus.write_text("\n".join(CORPUS * 3) + "\n")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=prefix,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        minloglevel=2,
        **LAYOUTS[layout],
    )
    return spm.SentencePieceProcessor(model_file=prefix + ".model")


def write_gguf(path, arch, sp, add_space_prefix, template):
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            t = TokenType.UNKNOWN
        elif sp.is_control(i):
            t = TokenType.CONTROL
        elif sp.is_unused(i):
            t = TokenType.UNUSED
        elif sp.is_byte(i):
            t = TokenType.BYTE
        elif tokens[-1] == "<tool_call>":
            t = TokenType.USER_DEFINED
        else:
            t = TokenType.NORMAL
        types.append(t)
    w = GGUFWriter(str(path), arch)
    w.add_name(f"spm-{path.stem}")
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    if sp.pad_id() >= 0:
        w.add_pad_token_id(sp.pad_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(add_space_prefix)
    if template is not None:
        w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def expected(path, arch, add_space_prefix, template, sp):
    tok = TOKENIZER_CLASS[arch].from_pretrained(str(path.parent), gguf_file=path.name)
    if arch == "llama" and not add_space_prefix:
        # transformers 5.23 builds a llama-architecture GGUF tokenizer with a prefix
        # space whatever `add_space_prefix` says; llama.cpp (and ktune) honour the
        # flag. The reference is then the tokenizer LlamaTokenizer builds for
        # add_prefix_space=False: no prepended "▁", no leading space stripped.
        backend = tok.backend_tokenizer
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never", split=False)
        backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    cases = []
    for text in TEXTS:
        ids = tok.encode(text)
        cases.append({"text": text, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=True)})
        # sentencepiece itself agrees on text without special tokens (a cross-check).
        # (the llama-noprefix file reuses a vocabulary trained with a dummy prefix).
        if "<" not in text and text.strip() and (add_space_prefix or arch != "llama"):
            ref = [sp.bos_id()] + sp.encode(text, out_type=int)
            if ref != ids:
                print(f"note: {path.name}: sentencepiece encodes {text!r} as {ref}, transformers as {ids}")
    out = {
        "about": f"tools/make_spm_gguf.py: transformers {transformers.__version__} loading {path.name}",
        "vocab_size": len(tok),
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "cases": cases,
    }
    if template is not None:
        messages = [{"role": "user", "content": "Hello there"}]
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        out["chat"] = {"prompt": "Hello there", "text": text, "ids": list(ids)}
    return out


def rendered_templates():
    """Every template in tests/fixtures/chat_templates/ rendered by transformers'
    own chat-template renderer for one user turn (today's date written DATE)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    out = {}
    for path in sorted(TEMPLATES.glob("*.jinja")):
        specials = CHAT_SPECIALS[path.stem]
        texts, _ = render_jinja_template(
            conversations=[[{"role": "user", "content": CHAT_PROMPT}]],
            chat_template=path.read_text(),
            add_generation_prompt=True,
            **specials,
        )
        # The date Llama 3.2's template asks strftime_now for is today's.
        text = re.sub(r"Today Date: [^\n]*", "Today Date: DATE", texts[0])
        out[path.name] = {**specials, "prompt": CHAT_PROMPT, "text": text}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="recompute and compare, write nothing")
    args = ap.parse_args()
    stub_torch()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        procs = {layout: train(layout, tmp) for layout in LAYOUTS}
        for name, arch, layout, prefix, template_file in FILES:
            template = (TEMPLATES / template_file).read_text() if template_file else None
            path = Path(tmp) / f"{name}.gguf"
            write_gguf(path, arch, procs[layout], prefix, template)
            exp = expected(path, arch, prefix, template, procs[layout])
            results[name] = (path.read_bytes(), exp)
    templates = rendered_templates()
    if args.check:
        bad = 0
        if json.loads((TEMPLATES / "rendered.json").read_text()) != templates:
            print("chat templates: rendered text differs")
            bad += 1
        for name, (_, exp) in results.items():
            old = json.loads((OUT / f"{name}.json").read_text())
            if old["cases"] != exp["cases"] or old.get("chat") != exp.get("chat"):
                print(f"{name}: expected ids differ")
                bad += 1
        sys.exit(1 if bad else 0)
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (data, exp) in results.items():
        (OUT / f"{name}.gguf").write_bytes(data)
        (OUT / f"{name}.json").write_text(json.dumps(exp, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {name}.gguf ({len(data)} bytes) and {name}.json")
    (TEMPLATES / "rendered.json").write_text(json.dumps(templates, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
