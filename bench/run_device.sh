#!/usr/bin/env bash
# What ran on the GPU machine (see bench/results/gpu.md). The machine has a CUDA torch and the
# project's dependencies but no network and no build backend, so the project is installed from
# wheels built beforehand (`pip wheel --no-deps -w dist . backends/*/ checkers/*/ reporters/*/`,
# carried in dist/). Usage: bash bench/run_device.sh PART [OUTDIR]
#   PART=gpu: install, `torchparity plugins`, backend + tracker tests, gpu_checks, cuda benches
#   PART=cpu: cProfile of the cuda dump/tracker, then the CPU benchmarks on the machine's 16 idle
#             cores (no msprobe there: it is not installable offline)
#   PART=issues17_18: the compile and watch tests on a CUDA machine (their CUDA cases run there),
#             bench_compile, bench_watch (bench model and ~100M Llama) with --device cuda
#   PART=s11: session 11's one prepared run (issues 15 and 17 on a GPU): gpu_checks, the op stream
#             on a ~1B bf16 HF Llama and the bench model, bench_compile --device cuda, a cProfile
#             of the 1B Llama's aten dump; each part under its own time limit, logs tee'd to OUTDIR
#   PART=s11b: the same after the NaN-screen sync fix, full logs kept: gpu_checks, the CUDA compile
#             test, the op stream on the bench model and the 1B Llama, bench_compile per step only
#   PART=s11c: after the row-wise statistics flush: its CUDA test, the 1B Llama, bench_compile, bench model
#   PART=s12a: session 12's first run (about 6 min): the CUDA tests, the 1B Llama at batch 1 and 8, a cProfile
#             and a torch.profiler of its module-level dump, bench_compile with the in-graph op off
#   PART=s12b: the one-pass Triton statistics kernel: its CUDA tests, the 1B Llama at batch 8 and 1,
#             torch.profiler of the batch-8 module-level dump (about 4 min)
#   PART=s12c: the statistics kernel per value size (bench_stat_kernel), cProfiles of the 1B Llama's module and
#             aten dumps, the Triton tests' full output (about 3 min)
#   PART=s12d: session 12's last run: the Triton tests, the kernel's variants per value size, gpu_checks, the 1B
#             Llama at batch 8, bench_compile per step (about 4.5 min)
#   PART=next: prepared for the next session with a GPU (about 8 min): the Triton tests, kernel variants with
#             vectorized loads, gpu_checks, the 1B Llama at batch 8 (with a torch.profiler; and with the dumps'
#             summaries at each step's end, no longer the default: the writer's GIL time) and 1, bench_compile
#             with the default and with --summaries step
#   PART=s16a: session 16's first run (about 5.5 min): the CUDA tests, gpu_checks, the 1B Llama at batch 8 (module,
#             aten, NaN/Inf screen, together), cProfiles of its NaN/Inf screen and of the compiled bench model's
#             capture, bench_compile per step, the bench model's op stream
#   PART=s16b: after the one statistics op per compiled graph (one Triton launch per dtype) and the NaN/Inf
#             screens' arena (about 5 min): their CUDA tests, gpu_checks, bench_compile per step, the 1B Llama
#             at batch 8, a cProfile of its NaN/Inf screen
#   PART=s16c: session 16's last run (about 5 min): the CUDA tests, gpu_checks, bench_compile per step and cold
#             compile (statistics ops in groups of values), the 1B Llama at batch 8, a cumulative cProfile of
#             the compiled bench model's capture
#   PART=s18: prepared in session 18 (no GPU then; about 6 min): the CUDA tests (the NaN/Inf screens' queue on
#             side streams among them, and the light tier's tests), gpu_checks, the 1B Llama at batch 8 with the
#             NaN/Inf screen queued and its light steps (row "NaN/Inf light steps"), a cProfile of its NaN/Inf
#             screen, bench_compile per step, the bench model's op stream (its light steps too)
#   PART=issue15: the op stream's figures on cuda (issue 15): the op-stream and capture tests, the
#             bench model and a ~1B bf16 HF Llama (seq 1024) with every consumer alone and
#             together, host syncs per step counted by torch.cuda.set_sync_debug_mode
set -u
part=${1:-gpu}
out=${2:-${OUT:-bench/results/device}}
mkdir -p "$out"
python -m pip install --no-deps --no-index -q --root-user-action=ignore dist/*.whl $(ls .whl/*.whl 2>/dev/null) 2>&1 | tail -2
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
stamp() { echo "=== $(date +%T) $*"; }
# is the installed wheel the working tree? (a dist/ left from an earlier state is not rebuilt by itself)
wheel_check() {
  local site; site=$(python -c "import torchparity, os; print(os.path.dirname(torchparity.__file__))")
  diff -rq --exclude=__pycache__ core/torchparity "$site" && echo "installed wheel = working tree" || echo "STALE WHEEL"
}
# session 16's steps, each under its own time limit (seconds, the first argument)
s16_pytest() {  # LIMIT [more test paths]: the CUDA tests of the statistics kernel, the compiled capture, the tracker
  local limit=$1; shift
  stamp pytest; timeout "$limit" python -m pytest -p no:cacheprovider -p no:warnings -rfE --tb=short \
    tests/capture/test_stat_triton.py tests/compile/test_compile_batched_stats.py tests/online/test_naninf_host_reads.py \
    "$@" > "$out/pytest.txt" 2>&1; tail -3 "$out/pytest.txt"
}
s16_checks() { stamp checks; timeout "$1" python bench/gpu_checks.py --out "$out/checks.md" > "$out/checks.log" 2>&1; tail -5 "$out/checks.log"; }
s16_compile() {  # LIMIT COLD_COMPILES
  stamp compile; timeout "$1" python bench/bench_compile.py --device cuda --compiles "$2" --rounds 3 --steps 7 \
    --out "$out/compile_cuda.md" 2>&1 | grep -E '^\||Capture'
}
s16_llama1b() {
  stamp llama1b-batch8; timeout "$1" python bench/bench_stream.py --device cuda --model llama1b --dtype bfloat16 --batch 8 \
    --rounds 1 --warmup 2 --levels module,aten --out "$out/stream_llama1b_b8.md" 2>&1 | grep -E '^\|'
}
s16_cprof_naninf() {  # LIMIT TOP
  stamp cprof-llama1b-b8-naninf; timeout "$1" python bench/profile_dump.py --device cuda --model llama1b --batch 8 --naninf \
    --steps 2 --top "$2" > "$out/cprof_llama1b_b8_naninf.txt" 2>&1; head -1 "$out/cprof_llama1b_b8_naninf.txt"
}
s16_cprof_compiled() {  # LIMIT TOP SORT
  stamp cprof-compiled; timeout "$1" python bench/profile_dump.py --device cuda --compiled --steps 5 --top "$2" --sort "$3" \
    > "$out/cprof_compiled.txt" 2>&1; grep -m1 "ms/step" "$out/cprof_compiled.txt"
}
if [ "$part" = s11 ]; then
  export PYTHONUNBUFFERED=1
  python -c "import torch; print('triton', __import__('triton').__version__)" 2>&1
  timeout 45 python bench/gpu_checks.py --out "$out/checks.md" 2>&1 | tail -12
  timeout 45 python -m pytest -q -p no:cacheprovider tests/compile/test_compile_batched_stats.py -k cuda 2>&1 | tail -3
  timeout 130 python bench/bench_stream.py --device cuda --model llama1b --dtype bfloat16 --rounds 3 \
    --levels module,aten --out "$out/stream_llama1b.md" 2>&1 | grep -E '^(\||- Model)'
  timeout 110 python bench/bench_compile.py --device cuda --rounds 3 --steps 5 --out "$out/compile_cuda.md" 2>&1 | grep -E '^\|'
  timeout 60 python bench/profile_dump.py --device cuda --model llama1b --level aten --steps 2 --top 30 \
    > "$out/profile_llama1b_aten.txt" 2>&1; head -40 "$out/profile_llama1b_aten.txt"
  timeout 50 python bench/bench_stream.py --device cuda --model bench --rounds 5 --levels module,api,aten \
    --out "$out/stream_bench.md" 2>&1 | grep -E '^\|'
elif [ "$part" = s11b ]; then
  export PYTHONUNBUFFERED=1
  stamp() { echo "=== $(date +%T) $*"; }
  stamp checks; timeout 45 python bench/gpu_checks.py --out "$out/checks.md" > "$out/checks.log" 2>&1; tail -4 "$out/checks.log"
  stamp pytest; timeout 45 python -m pytest -p no:cacheprovider -p no:warnings tests/compile/test_compile_batched_stats.py \
    tests/online/test_naninf_host_reads.py 2>&1 | tail -4
  stamp stream-bench; timeout 60 python bench/bench_stream.py --device cuda --model bench --rounds 5 --levels module,aten \
    --out "$out/stream_bench.md" 2>&1 | grep -E '^\|'
  for lv in module aten; do
    stamp profile-$lv; timeout 40 python bench/profile_dump.py --device cuda --level $lv --steps 3 --top 40 \
      > "$out/profile_$lv.txt" 2>&1; head -3 "$out/profile_$lv.txt"
  done
  stamp compile; timeout 120 python bench/bench_compile.py --device cuda --compiles 0 --rounds 4 --steps 5 \
    --out "$out/compile_cuda.md" 2>&1 | grep -E 'round|^\|'
  stamp llama1b; timeout 150 python bench/bench_stream.py --device cuda --model llama1b --dtype bfloat16 --rounds 2 \
    --levels module,aten --out "$out/stream_llama1b.md" 2>&1 | grep -vE '^\s*$|warn'
  stamp done
elif [ "$part" = s11c ]; then
  export PYTHONUNBUFFERED=1
  stamp() { echo "=== $(date +%T) $*"; }
  stamp pytest; timeout 40 python -m pytest -p no:cacheprovider -p no:warnings tests/capture/test_stat_batch.py \
    tests/online/test_naninf_host_reads.py -k "boundaries or host_reads or one_kernel" 2>&1 | tail -3
  stamp llama1b; timeout 120 python bench/bench_stream.py --device cuda --model llama1b --dtype bfloat16 --rounds 1 \
    --levels module,aten --out "$out/stream_llama1b.md" 2>&1 | grep -vE '^\s*$|warn'
  stamp compile; timeout 45 python bench/bench_compile.py --device cuda --compiles 0 --rounds 4 --steps 5 \
    --out "$out/compile_cuda.md" 2>&1 | grep -E 'round|^\|'
  stamp stream-bench; timeout 35 python bench/bench_stream.py --device cuda --model bench --rounds 3 --levels module,aten \
    --out "$out/stream_bench.md" 2>&1 | grep -E '^\|'
  stamp done
elif [ "$part" = s12a ]; then
  export PYTHONUNBUFFERED=1
  stamp() { echo "=== $(date +%T) $*"; }
  stamp pytest; timeout 50 python -m pytest -p no:cacheprovider -p no:warnings tests/capture/test_stat_batch.py \
    tests/online/test_naninf_host_reads.py tests/compile/test_compile_batched_stats.py 2>&1 | tail -3
  stamp llama1b; timeout 90 python bench/bench_stream.py --device cuda --model llama1b --dtype bfloat16 --rounds 1 \
    --levels module,aten --out "$out/stream_llama1b.md" 2>&1 | grep -E 'round'
  stamp cprofile-llama1b-module; timeout 45 python bench/profile_dump.py --device cuda --model llama1b --level module \
    --steps 2 --top 45 > "$out/cprof_llama1b_module.txt" 2>&1; head -1 "$out/cprof_llama1b_module.txt"
  stamp tprof-llama1b-module; timeout 45 python bench/profile_dump.py --device cuda --model llama1b --level module \
    --torch-profiler --steps 2 --top 30 > "$out/tprof_llama1b_module.txt" 2>&1; grep -m1 "ms/step" "$out/tprof_llama1b_module.txt"
  stamp llama1b-batch8; timeout 80 python bench/bench_stream.py --device cuda --model llama1b --dtype bfloat16 --batch 8 \
    --rounds 1 --levels module,aten --out "$out/stream_llama1b_b8.md" 2>&1 | grep -E 'round'
  stamp compile-off; timeout 40 python bench/bench_compile.py --device cuda --compiles 0 --rounds 3 --steps 5 \
    --device-stats off --out "$out/compile_cuda_off.md" 2>&1 | grep -E 'round|^\|'
  stamp done
elif [ "$part" = s12b ]; then
  export PYTHONUNBUFFERED=1
  wheel_check
  python -c "import triton; print('triton', triton.__version__)"
  stamp pytest; timeout 75 python -m pytest -p no:cacheprovider -p no:warnings tests/capture/test_stat_triton.py \
    tests/capture/test_stat_batch.py tests/online/test_naninf_host_reads.py tests/compile/test_compile_batched_stats.py \
    2>&1 | tail -4
  stamp llama1b-batch8; timeout 75 python bench/bench_stream.py --device cuda --model llama1b --dtype bfloat16 --batch 8 \
    --rounds 1 --levels module,aten --out "$out/stream_llama1b_b8.md" 2>&1 | grep -E 'round'
  stamp llama1b; timeout 50 python bench/bench_stream.py --device cuda --model llama1b --dtype bfloat16 --rounds 1 \
    --levels module,aten --out "$out/stream_llama1b.md" 2>&1 | grep -E 'round'
  stamp tprof-llama1b-b8-module; timeout 40 python bench/profile_dump.py --device cuda --model llama1b --batch 8 \
    --level module --torch-profiler --steps 2 --top 30 > "$out/tprof_llama1b_b8_module.txt" 2>&1
  grep -m1 "ms/step" "$out/tprof_llama1b_b8_module.txt"
  stamp done
elif [ "$part" = s12c ]; then
  export PYTHONUNBUFFERED=1
  wheel_check
  stamp pytest; timeout 60 python -m pytest -p no:cacheprovider -p no:warnings -rfE --tb=short \
    tests/capture/test_stat_triton.py tests/capture/test_stat_batch.py > "$out/pytest.txt" 2>&1; tail -3 "$out/pytest.txt"
  stamp stat-kernel; timeout 40 python bench/bench_stat_kernel.py --device cuda --out "$out/stat_kernel.md" 2>&1 | grep -E '^\|'
  for lv in module aten; do
    stamp cprofile-llama1b-$lv; timeout 45 python bench/profile_dump.py --device cuda --model llama1b --level $lv \
      --steps 2 --top 60 > "$out/cprof_llama1b_$lv.txt" 2>&1; head -1 "$out/cprof_llama1b_$lv.txt"
  done
  stamp done
elif [ "$part" = s12d ]; then
  export PYTHONUNBUFFERED=1
  wheel_check
  stamp pytest; timeout 50 python -m pytest -p no:cacheprovider -p no:warnings -rfE --tb=short tests/capture/test_stat_triton.py \
    tests/capture/test_stat_batch.py tests/online/test_naninf_host_reads.py tests/compile/test_compile_batched_stats.py \
    > "$out/pytest.txt" 2>&1; tail -3 "$out/pytest.txt"
  stamp stat-kernel; timeout 45 python bench/bench_stat_kernel.py --device cuda --sizes 1024,262144,4194304,67108864 \
    --variants 2048:8:8,1024:4:16,4096:8:4,512:4:16 --out "$out/stat_kernel.md" 2>&1 | grep -E '^\|' | head -40
  stamp checks; timeout 40 python bench/gpu_checks.py --out "$out/checks.md" > "$out/checks.log" 2>&1; tail -5 "$out/checks.log"
  stamp llama1b-batch8; timeout 85 python bench/bench_stream.py --device cuda --model llama1b --dtype bfloat16 --batch 8 \
    --rounds 1 --warmup 2 --levels module,aten --out "$out/stream_llama1b_b8.md" 2>&1 | grep -E 'round'
  stamp compile; timeout 40 python bench/bench_compile.py --device cuda --compiles 0 --rounds 3 --steps 7 \
    --out "$out/compile_cuda.md" 2>&1 | grep -E 'round|^\|'
  stamp done
elif [ "$part" = next ]; then
  # prepared for the next session with a GPU (about 5 min): what session 12 changed after its last run
  # (vectorized loads: the size is specialized; the kernel shape 2048 x 8 warps; dense permuted values)
  export PYTHONUNBUFFERED=1
  wheel_check
  stamp pytest; timeout 50 python -m pytest -p no:cacheprovider -p no:warnings -rfE --tb=short tests/capture/test_stat_triton.py \
    tests/capture/test_stat_batch.py tests/compile/test_compile_batched_stats.py > "$out/pytest.txt" 2>&1; tail -3 "$out/pytest.txt"
  # variants: fewer programs (each loops more: a program's closing reductions of its six accumulators
  # weigh less on a 4 M-element value, where 8 per SM loop about once) and fewer lanes per thread
  # (the float64 accumulators' registers: occupancy)
  stamp stat-kernel; timeout 75 python bench/bench_stat_kernel.py --device cuda --sizes 1024,262144,4194304,67108864 \
    --variants 1024:4:8,4096:8:4,2048:8:16,2048:8:2,1024:8:4,512:4:8 --out "$out/stat_kernel.md" 2>&1 | grep -E '^\|' | head -40
  stamp checks; timeout 40 python bench/gpu_checks.py --out "$out/checks.md" > "$out/checks.log" 2>&1; tail -5 "$out/checks.log"
  stamp llama1b-batch8; timeout 85 python bench/bench_stream.py --device cuda --model llama1b --dtype bfloat16 --batch 8 \
    --rounds 1 --warmup 2 --levels module,aten --out "$out/stream_llama1b_b8.md" 2>&1 | grep -E 'round'
  stamp tprof-llama1b-b8-module; timeout 45 python bench/profile_dump.py --device cuda --model llama1b --batch 8 \
    --level module --torch-profiler --steps 2 --top 30 > "$out/tprof_llama1b_b8_module.txt" 2>&1
  grep -m1 "ms/step" "$out/tprof_llama1b_b8_module.txt"
  stamp llama1b; timeout 60 python bench/bench_stream.py --device cuda --model llama1b --dtype bfloat16 --rounds 1 \
    --warmup 2 --levels module,aten --out "$out/stream_llama1b.md" 2>&1 | grep -E 'round'
  stamp llama1b-batch8-step-summaries; timeout 85 python bench/bench_stream.py --device cuda --model llama1b \
    --dtype bfloat16 --batch 8 --rounds 1 --warmup 2 --levels module,aten --summaries step \
    --out "$out/stream_llama1b_b8_stepsumm.md" 2>&1 | grep -E 'round'
  stamp compile; timeout 40 python bench/bench_compile.py --device cuda --compiles 0 --rounds 3 --steps 7 \
    --out "$out/compile_cuda.md" 2>&1 | grep -E 'round|^\|'
  stamp compile-step-summaries; timeout 40 python bench/bench_compile.py --device cuda --compiles 0 --rounds 3 \
    --steps 7 --summaries step --out "$out/compile_cuda_stepsumm.md" 2>&1 | grep -E '^\|'
  stamp done
elif [ "$part" = s16a ]; then
  export PYTHONUNBUFFERED=1
  wheel_check
  s16_pytest 75 tests/capture/test_stat_batch.py tests/backends tests/dump/test_faults.py
  s16_checks 40
  s16_llama1b 100
  s16_cprof_naninf 45 40
  s16_compile 45 0
  s16_cprof_compiled 40 40 tottime
  stamp stream-bench; timeout 40 python bench/bench_stream.py --device cuda --model bench --rounds 3 --levels module,aten \
    --out "$out/stream_bench.md" 2>&1 | grep -E '^\|'
  stamp done
elif [ "$part" = s16b ]; then
  export PYTHONUNBUFFERED=1
  wheel_check
  s16_pytest 100
  s16_checks 40
  s16_compile 45 0
  s16_llama1b 100
  s16_cprof_naninf 45 45
  stamp done
elif [ "$part" = s18 ]; then
  wheel_check
  s16_pytest 90 tests/online/test_naninf_light.py
  s16_checks 45
  s16_llama1b 150
  s16_cprof_naninf 45 40
  s16_compile 45 0
  stamp stream-bench; timeout 40 python bench/bench_stream.py --device cuda --model bench --rounds 3 --levels module,aten \
    --out "$out/stream_bench.md" 2>&1 | grep -E '^\|'
  stamp done
elif [ "$part" = s16c ]; then
  export PYTHONUNBUFFERED=1
  wheel_check
  s16_pytest 60
  s16_checks 20
  s16_compile 130 1
  s16_llama1b 100
  s16_cprof_compiled 30 50 cumulative
  stamp done
elif [ "$part" = issues17_18 ]; then
  python -m pytest -q -p no:cacheprovider tests/compile tests/watch 2>&1 | tail -5 | tee "$out/pytest_17_18.txt"
  python bench/bench_compile.py --device cuda --rounds 5 --steps 5 --out "$out/compile_cuda.md" 2>&1 | grep -E '^\|'
  python bench/bench_watch.py --device cuda --rounds 5 --steps 10 --out "$out/watch_cuda.md" 2>&1 | grep -E 'Amortized|^\|'
  python bench/bench_watch.py --device cuda --model llama100m --rounds 5 --steps 10 \
    --out "$out/watch_llama100m_cuda.md" 2>&1 | grep -E 'Amortized|^\|'
elif [ "$part" = issue15 ]; then
  python -m pytest -q -p no:cacheprovider tests/capture tests/online/test_naninf_stream.py \
    tests/online/test_compare_stream.py 2>&1 | tail -5 | tee "$out/pytest_issue15.txt"
  python bench/bench_stream.py --device cuda --model bench --rounds 5 --online --out "$out/stream_cuda.md" 2>&1 | grep -E '^\|'
  python bench/bench_stream.py --device cuda --model llama1b --dtype bfloat16 --rounds 3 --levels module,aten \
    --out "$out/stream_llama1b_cuda.md" 2>&1 | grep -E '^\|'
  python bench/bench_naninf.py --device cuda --rounds 7 --out "$out/naninf_cuda.md" 2>&1 | tail -8
elif [ "$part" = gpu ]; then
  echo '$ torchparity plugins'; python -m torchparity plugins 2>&1 | tee "$out/plugins.txt"; echo "exit ${PIPESTATUS[0]}"
  echo "$ pytest tests/backends tests/online/test_naninf.py"
  python -m pytest -q -p no:cacheprovider tests/backends tests/online/test_naninf.py 2>&1 | tail -15 | tee "$out/pytest.txt"
  python bench/gpu_checks.py --out "$out/gpu_checks.md" 2>&1 | tail -40
  python bench/bench_naninf.py --device cuda --rounds 7 --out "$out/naninf_cuda.md" 2>&1 | tail -8
  python bench/bench_dump.py --device cuda --modes statistics --msprobe-python '' --rounds 5 \
    --out "$out/dump_cuda.md" 2>&1 | grep -E '^\|' 
else
  for lv in module aten; do
    python bench/profile_dump.py --device cuda --level $lv --steps 3 --top 14 2>&1 | tee "$out/profile_cuda_$lv.txt" | head -24
  done
  python bench/profile_dump.py --device cuda --naninf --steps 3 --top 10 2>&1 | tee "$out/profile_cuda_naninf.txt" | head -18
  python bench/bench_naninf.py --rounds 7 --out "$out/naninf_cpu16.md" 2>&1 | tail -8
  python bench/bench_dump.py --msprobe-python '' --rounds 5 --out "$out/dump_cpu16.md" 2>&1 | grep -E '^(\||Tool off)'
fi
