#!/usr/bin/env bash
# The real data some tests read (../shared/data, or $HF_LIGHTNING_SHARED_DATA): 14 files from public GitHub
# repositories at pinned commits, each checked against its SHA-256. Sources and licenses: docs/testing.md.
#   scripts/fetch_shared_data.sh DIR     (then: export HF_LIGHTNING_SHARED_DATA=DIR, or use ../shared/data)
# BASE_URL: where owner/repo/commit/path are read from (default GitHub's raw files; a file:// mirror works too).
set -euo pipefail
DIR=${1:?usage: scripts/fetch_shared_data.sh DIR}
BASE_URL=${BASE_URL:-https://raw.githubusercontent.com}
while read -r local repo commit path sha; do
    mkdir -p "$DIR/$(dirname "$local")"
    curl -fsSL "$BASE_URL/$repo/$commit/$path" -o "$DIR/$local.part"
    got=$(sha256sum "$DIR/$local.part" | cut -d" " -f1)
    if [ "$got" != "$sha" ]; then
        echo "fetch_shared_data: $local: SHA-256 $got, expected $sha (from $repo@$commit:$path)" >&2
        rm -f "$DIR/$local.part"
        exit 1
    fi
    mv "$DIR/$local.part" "$DIR/$local"
    echo "$local"
done <<'FILES'
gsm8k/train.jsonl openai/grade-school-math 3101c7d5072418e28b9008a6636bde82a006892c grade_school_math/data/train.jsonl 17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465
gsm8k/test.jsonl openai/grade-school-math 3101c7d5072418e28b9008a6636bde82a006892c grade_school_math/data/test.jsonl 3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14
self-instruct/seed_tasks.jsonl yizhongw/self-instruct 0b26ccaa415992100fa32df62d41b994cf928e23 data/seed_tasks.jsonl 7779004fa198fdf27cf70a159363879d8a26c53329e11b436af17b3941875f48
self-instruct/user_oriented_instructions.jsonl yizhongw/self-instruct 0b26ccaa415992100fa32df62d41b994cf928e23 human_eval/user_oriented_instructions.jsonl 81d60a117db495cecedecd9193504fd07c5b5a42f6699ef6b0f9da10fc22f42e
humaneval/HumanEval.jsonl.gz openai/human-eval 6d43fb980f9fee3c892a914eda09951f772ad10d data/HumanEval.jsonl.gz b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef
fastchat-dummy/dummy_conversation.json lm-sys/FastChat 0e6d3e4beaab66f4d3f93db72541a4abab8af28d data/dummy_conversation.json 534c5a1079f2eb61ff96633330ce87c4743f5b6d5b1691b44a65920473540470
alpaca-tiny/alpaca_tiny.json pytorch/torchtune bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1 tests/assets/alpaca_tiny.json b1e3ff228aa9c61b524f85f859640fd07c0b94895047222dba6deec978afdfc0
tinyshakespeare/input.txt karpathy/char-rnn 6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e data/tinyshakespeare/input.txt 86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed
c4-demo/c4_demo.jsonl hiyouga/LLaMA-Factory ff6d4d12eeb035d6ce06805a5733dd7b29f2ac30 data/c4_demo.jsonl f51528081ef22279f2840c02c4cd7cdfc372138be0817c5b8714d200af692b78
banking77/train.csv PolyAI-LDN/task-specific-datasets 57ec275d8078af65b7731c2a98be812d844a6d6b banking_data/train.csv b06e26ac675513959a63135f11b94ea7786ed02da65db93a5650d8838cbc664b
banking77/test.csv PolyAI-LDN/task-specific-datasets 57ec275d8078af65b7731c2a98be812d844a6d6b banking_data/test.csv d12d6e3bc4c3103966ae786dc435913c0c563dfa328f5a3646d0e62cfeeb474d
banking77/categories.json PolyAI-LDN/task-specific-datasets 57ec275d8078af65b7731c2a98be812d844a6d6b banking_data/categories.json 53261da888122daf2d120d925458631d9619e15d82e56052e7a42e535ce32b63
hh-rlhf/harmless-base-test.jsonl.gz anthropics/hh-rlhf 354e5c3cb8960630860dd5774a6ac2a58313bf4d harmless-base/test.jsonl.gz ebfaaed21162a4de120ae85366075b34425e2a6303fac59b99555002f7016f03
gpt2-tokenizer/tokenizer.json EleutherAI/gpt-neox ea7aefd8f8e183256992d9fede4d7c71a46d67a5 tests/data/hf_cache/tokenizer/gpt2.json e88dafdf79f2026eaffb161c36a8b914b5fa586a620d108b9fecc117f74dbdd7
FILES
