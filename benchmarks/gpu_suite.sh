#!/usr/bin/env bash
# The GPU suite, from a clean checkout on a CUDA machine (the H200 here):
# installs the checkout (not editable) beside the carried simpy wheel, then
# runs one part:
#   tests   the GPU correctness tests (kernels, backends, KV and state views,
#           the real executor) and a real replay of a bundled trace slice;
#   check   benchmarks/real_check.py (real size, bf16, against transformers);
#   bench   benchmarks/bench_real_decode.py (uncompiled and compiled) and
#           benchmarks/bench_attention.py;
#   overlap benchmarks/bench_move_overlap.py --trace: the side-stream split
#           against the control (docs/real_executor.md, the number that
#           decides issue 16's side-stream target);
#   validate benchmarks/validate_real.py real --compiled --prefill-graphs
#           (the 12 validation cells; then `validate_real.py compare` on
#           the CPU, results/validation/h200/README.md);
#   profiles benchmarks/profile_model.py --compiled --prefill-graphs for
#           the bundled profiled models (about 200-270 s each; MODELS
#           names a subset, e.g. MODELS="gemma-3-12b gpt-oss-20b", to fit
#           a device call's 600 s).
#   hybrid  benchmarks/profile_model.py for nemotron-3-nano-30b-a3b, the
#           model with recurrent state: decode through the decode graphs'
#           buckets (the state's gather and scatter captured inside them),
#           each prefill chunk padded to its token bucket and captured
#           over the compiled blocks (--compiled --prefill-graphs: the
#           state's gather, the Mamba-2 mixers' padded path,
#           sim/real/padded_chunk.py, and the scatter in one graph; its
#           decode buckets stay uncompiled); to decide whether it can be
#           bundled.
#   hybrid-prefill benchmarks/profile_state_prefill.py for nemotron-3-nano-30b-a3b:
#           one prefill chunk of 512 and of 4,096 tokens (no cache) under
#           torch.profiler, its CUDA time by module kind (Mamba-2 mixer,
#           MoE, attention, the state's gather and scatter, other), the
#           top 20 ops, kernel launches and host syncs, each point with
#           the executor's scan (unikv's Triton SSD kernels,
#           sim/real/ssd.py), their einsum reference and transformers'
#           own (about 3-4 min, most of it the model's build); report and summary in
#           $out/hybrid_prefill/, with the Chrome traces in
#           $out/hybrid_prefill.tar.gz (docs/real_executor.md); then the
#           same chunks through the compiled blocks (--compiled, the
#           kernels' scan) into $out/hybrid_prefill_compiled/.
# Logs and outputs go to $OUT (default results/real/h200).
#
#   bash benchmarks/gpu_suite.sh tests check    # one device call
#   bash benchmarks/gpu_suite.sh bench          # another
# PYTEST_ARGS adds pytest options to the tests part, e.g. "-n 6 --dist
# loadfile" with pytest-xdist's wheel carried in .whl (the compile-heavy
# tests are bound by one host core each; loadfile keeps a module's
# fixtures in one worker).
set -uo pipefail
out=${OUT:-results/real/h200}
mkdir -p "$out"
if [ ! -d /tmp/site/unikv ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site . || exit 1
fi
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
{
    date -u +%FT%TZ
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "transformers", transformers.__version__)'
    cat REVISION 2>/dev/null
} > "$out/machine.txt"
cat "$out/machine.txt"

for part in "$@"; do
    case $part in
    tests)
        # the checkout after the install on the path: tests import their own helpers (tests.unikv.factories)
        # shellcheck disable=SC2086
        PYTHONPATH=/tmp/site:$PWD python3 -P -m pytest -q -rs --timeout 300 -p no:cacheprovider --durations 15 \
            ${PYTEST_ARGS:-} \
            tests/kernels tests/backends tests/unikv/test_kv_views.py tests/unikv/test_state_views.py \
            tests/unikv/test_page_rows.py tests/unikv/test_pool_pages.py tests/unikv/test_float.py \
            tests/sim/real tests/bad_input/test_executor_options.py 2>&1 | tee "$out/pytest_gpu.log"
        python3 -P -m unikv replay --executor real --device cuda --dtype bf16 --decode-graphs \
            --model tests/data/configs/meta-llama--Meta-Llama-3.1-8B_config.json --trace azure_conv \
            --max-requests 64 --kv-budget-gib 4 --format csv --no-figures --quiet \
            --out "$out/replay_llama_azure_conv" 2>&1 | tee "$out/replay_llama.log"
        ;;
    check)
        python3 -P benchmarks/real_check.py --out "$out" 2>&1 | tee "$out/real_check.log"
        ;;
    bench)
        python3 -P benchmarks/bench_real_decode.py --compile --out "$out/decode.csv" 2>&1 | tee "$out/decode.log"
        python3 -P benchmarks/bench_attention.py --out "$out/attention.csv" 2>&1 | tee "$out/attention.log"
        ;;
    overlap)
        python3 -P benchmarks/bench_move_overlap.py --trace --modes none control side-early side same \
            --steps 30 --warm 3 --out "$out/move_split" 2>&1 | tee "$out/move_split.log"
        ;;
    validate)
        python3 benchmarks/validate_real.py real --compiled --prefill-graphs --out "$out/validation" 2>&1 \
            | tee "$out/validate_real.log"
        ;;
    profiles)
        for model in ${MODELS:-gemma-3-12b gpt-oss-20b llama-3.1-8b}; do
            python3 benchmarks/profile_model.py --model "$model" --gpu h200 --reps 5 --compiled --prefill-graphs \
                --out "$out/profiles/${model}__h200.json" --heldout "$out/profiles/${model}__h200_heldout.json" \
                --revision "$(cat REVISION 2>/dev/null || echo unknown)" 2>&1 | tee "$out/${model}_profile.log"
        done
        ;;
    hybrid)
        model=nemotron-3-nano-30b-a3b
        python3 benchmarks/profile_model.py --model "$model" --gpu h200 --reps 5 --compiled --prefill-graphs \
            --out "$out/profiles/${model}__h200.json" --heldout "$out/profiles/${model}__h200_heldout.json" \
            --revision "$(cat REVISION 2>/dev/null || echo unknown)" 2>&1 | tee "$out/${model}_profile.log"
        ;;
    hybrid-prefill)
        python3 benchmarks/profile_state_prefill.py --model nemotron-3-nano-30b-a3b --gpu h200 \
            --chunks 512 4096 --cached 0 --reps 2 --trace --out "$out/hybrid_prefill" 2>&1 \
            | tee "$out/hybrid_prefill.log"
        python3 benchmarks/profile_state_prefill.py --model nemotron-3-nano-30b-a3b --gpu h200 --compiled \
            --scans kernels --chunks 512 4096 --cached 0 --reps 2 --out "$out/hybrid_prefill_compiled" 2>&1 \
            | tee "$out/hybrid_prefill_compiled.log"
        ;;
    *)
        echo "error: unknown part $part (tests, check, bench, overlap, validate, profiles, hybrid, hybrid-prefill)" >&2
        exit 2
        ;;
    esac
done
