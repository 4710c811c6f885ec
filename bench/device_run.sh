#!/usr/bin/env bash
# Everything a GPU run needs in one command: build, GPU tests, benchmark, a short table last.
#
#   bash bench/device_run.sh [--results DIR] [stages...]
#   stages: build test (TEST_ARGS) ptest (PTEST_LANES) gputest bench gatedbench stream streamtest quick diag host spread trace lab projlab profile fusedprobe sanitize probe demo firstcall ffma abold (default: build test bench)
#
# Results (JSON) go to the results folder: DIR, else $RESULTS_DIR, else build/gpu/.
# The stage logs go to its logs/, packed into logs.tar.gz at the end (one file
# to copy off the machine instead of one per stage).
set -uo pipefail
cd "$(dirname "$0")/.."

usage() { # the comment block at the top of this file
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}

results=${RESULTS_DIR:-build/gpu}
stages=()
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; echo "results folder: $results"; exit 0 ;;
    --results)
      [ $# -ge 2 ] || { echo "--results needs a folder" >&2; exit 2; }
      results=$2; shift ;;
    --results=*) results=${1#--results=} ;;
    *) stages+=("$1") ;;
  esac
  shift
done
[ ${#stages[@]} -gt 0 ] || stages=(build test bench)

LOG=$results/logs
mkdir -p "$results" "$LOG" build
export MAX_JOBS=${MAX_JOBS:-16} PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# One architecture keeps the build short: sm_90 (H200) unless set; setup.py's
# default builds sm_80/86/89/90+PTX. The floor and lab stages compile for sm_90.
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
# A g++ that links libstdc++ statically into the extension (some toolchain
# wrappers first on PATH do) makes a TORCH_CHECK message segfault in it; the
# system compiler does not, so it is preferred unless CXX is set.
[ -z "${CXX:-}" ] && [ -x /usr/bin/g++ ] && export CXX=/usr/bin/g++ CC=/usr/bin/gcc
# The multi-GPU tests need plain NCCL only: NVLink multicast (NCCL NVLS,
# symmetric memory, NVSHMEM) stays off unless set, so they do not depend on a
# host's multicast set-up (tests/conftest.py does the same).
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1} \
  NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
status=0
summary=()

stage() { # name, command...
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$LOG/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-9s rc=%-3s %4ss' "$name" "$rc" $((SECONDS - t0)))")
  [ $rc -eq 0 ] || status=1
  return $rc
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

for s in "${stages[@]}"; do
  case $s in
    build)
      stage build python3 setup.py build_ext --inplace || { tail -40 "$LOG/build.log"; break; }
      stage floor nvcc -O3 -std=c++17 -arch=sm_90 bench/floor.cu -o build/floor ;;
    test)
      # TEST_ARGS narrows the run, e.g. TEST_ARGS='tests -k "not cpu"'
      eval "stage test python3 -m pytest -q -rfs --tb=short --durations=15 --junitxml $LOG/test.xml -o junit_family=xunit1 ${TEST_ARGS:-tests}"
      grep -E "^(FAILED|ERROR)|passed|failed" "$LOG/test.log" | tail -60 ;;
    ptest) # the whole suite as PTEST_LANES (default 4) pytest processes on one GPU, each file in one lane: ~2x
      # faster than `test`. The stream's resident-kernel tests stay out (streamtest runs them alone).
      lanes=${PTEST_LANES:-4}
      # heaviest first, each to the lane with the least so far (weights: seconds a file took on an H100)
      python3 - "$lanes" >"$LOG/ptest_lanes" <<'PY'
import pathlib, sys
weight = {"test_gated_ops": 220, "test_fidelity_grads": 100, "test_lstm_module": 100, "test_dropin_surface": 85,
          "test_training": 80, "test_gru_module": 60, "test_compile": 60, "test_gpu_kernels": 50, "test_multi_gpu": 45,
          "test_reliability": 45}
files = sorted((p.stem for p in pathlib.Path("tests").glob("test_*.py")), key=lambda f: -weight.get(f, 20))
lanes = [[0, []] for _ in range(int(sys.argv[1]))]
for f in files:
    lane = min(lanes, key=lambda l: l[0])
    lane[0] += weight.get(f, 20)
    lane[1].append(f"tests/{f}.py")
print("\n".join(" ".join(l[1]) for l in lanes))
PY
      i=0
      while read -r files; do
        stage_bg() { stage "ptest_$1" python3 -m pytest -q -rfs --tb=short -p no:cacheprovider "${@:2}"; }
        # shellcheck disable=SC2086
        (stage_bg $i $files; printf '%s\n' "${summary[-1]}" >"$LOG/ptest_$i.rc") &
        i=$((i + 1))
      done <"$LOG/ptest_lanes"
      wait
      for ((j = 0; j < i; j++)); do
        summary+=("$(cat "$LOG/ptest_$j.rc")"); grep -q "rc=0 " "$LOG/ptest_$j.rc" || status=1
        grep -hE "^(FAILED|ERROR)|passed|failed" "$LOG/ptest_$j.log" | tail -20
      done ;;
    gputest)
      stage gputest python3 -m pytest -q -rs --durations=10 tests/test_gpu_kernels.py
      tail -30 "$LOG/gputest.log" ;;
    bench)
      stage bench python3 bench/bench.py --floor build/floor --out "$results"
      tail -115 "$LOG/bench.log" ;;
    gatedbench) # the LSTM and GRU grids against nn's (their issues' grid), a process a cell and dtype: a
      # stopped run keeps the records of those done
      for cell in lstm gru; do
        for dt in bfloat16 float16 float32; do
          stage "bench_${cell}_$dt" python3 bench/bench.py --cell "$cell" --dtype "$dt" --out "$results"
          tail -22 "$LOG/bench_${cell}_$dt.log"
        done
      done ;;
    stream) # one timestep a call: Stream.step against nn.RNN eager and in a CUDA graph
      stage stream python3 bench/stream_bench.py --out "$results"
      tail -25 "$LOG/stream.log" ;;
    streamtest)
      stage streamtest python3 -m pytest -q -rfs --tb=short --durations=10 tests/test_stream.py
      tail -30 "$LOG/streamtest.log" ;;
    diag)
      stage diag python3 bench/bench.py --diag
      cat "$LOG/diag.log" ;;
    lab) # the cluster kernels alone (no torch): per-step slopes at fixed shapes
      nvcc -O3 -std=c++17 -arch=sm_90 -I csrc/kernels -I bench/lab bench/lab/cluster_lab.cu -o build/clab
      stage lab build/clab cluster; cat "$LOG/lab.log" ;;
    profile)
      stage profile ncu --clock-control none --kernel-name regex:rnn_kernel --launch-skip 2 --launch-count 1 \
        --section WarpStateStats --section SchedulerStats --section SourceCounters --section MemoryWorkloadAnalysis \
        python3 bench/lab/profile_step.py ${PROFILE_DTYPE:-bfloat16} 4
      grep -E "Stall|stall|Warp Cycles|Issued|Eligible|Active Warps|L2 Hit|Mem Busy|Max Bandwidth|Hit Rate" "$LOG/profile.log" | head -60 ;;
    trace) # timelines of one eager forward and training step (the logs hold the full listing)
      for dt in bfloat16 float32; do
        stage trace_$dt python3 bench/lab/trace_step.py $dt 4 1024 --out "$results/trace"
        grep "==" "$LOG/trace_$dt.log"
      done
      tar czf "$results/trace.tar.gz" -C "$results" trace && rm -r "$results/trace" ;;
    fusedprobe) # prnn::layer with its projection never / by rule / always fused (ncu cannot profile that launch)
      # PROBE_CASES: "dtype:hidden" pairs
      for case in ${PROBE_CASES:-float32:1024}; do
        for setting in 0 rule 1; do
          name=fused_${case/:/_}_$setting
          if [ $setting = rule ]; then unset_or_set=(-u PRNN_FUSED_PROJECTION); else unset_or_set=(PRNN_FUSED_PROJECTION=$setting); fi
          stage $name env "${unset_or_set[@]}" python3 bench/lab/fused_probe.py ${case%:*} ${case#*:} ${PROBE_BATCHES:-1 2 4}
          grep "^fused_probe" "$LOG/$name.log"
        done
      done ;;
    projlab) # the fused layer's kernel alone: recurrence, producers alone, both (bench/lab/projection_lab.cu)
      nvcc -O3 -std=c++17 -arch=sm_90 -I csrc/kernels -I bench/lab bench/lab/projection_lab.cu -o build/plab
      stage plab build/plab projection; cat "$LOG/plab.log"
      nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 100 \
        >"$LOG/plab_clocks.log" &
      smi=$!
      build/plab sustain sustain | while read -r line; do echo "$(date +%H:%M:%S.%N | cut -c1-12) $line"; done
      kill $smi
      awk -F, '{print $1, $2, $3}' "$LOG/plab_clocks.log" | tr -s ' ' | paste -sd' ' | fold -w 4000 | head -c 6000; echo ;;
    host) # the host time of each piece of a module forward
      for dt in float32 bfloat16; do
        stage host_$dt python3 bench/bench.py --host $dt
        cat "$LOG/host_$dt.log"
      done ;;
    spread) # eager figures round to round, and the GPU-only time behind a spin
      stage spread python3 bench/lab/spread.py ${SPREAD_ROUNDS:-5} ${SPREAD_SHAPES:-}
      grep "^spread" "$LOG/spread.log" ;;
    quick)
      stage quick python3 bench/bench.py --quick --floor build/floor --out "$results/quick"
      tail -20 "$LOG/quick.log" ;;
    demo)
      stage demo python3 -m torch_prnn.demo
      tail -8 "$LOG/demo.log" ;;
    firstcall)
      stage firstcall python3 bench/first_call.py --out "$results"
      tail -14 "$LOG/firstcall.log" ;;
    sanitize) # SANITIZE_TOOLS narrows the tools, SANITIZE_TIERS the cases, SANITIZE_ARGS adds options
      # synccheck tracks only a few mbarriers per CTA unless told more: the cluster
      # kernel has 16 per CTA and runs clean with 8192 (bench/lab/cluster_probe.cu
      # reproduces the tool's failure with 16 and shows the limit). racecheck
      # also reports cuBLAS's split-K GEMM (the weight gradient): the hazard
      # lines are listed per kernel below.
      for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
        tool_args=()
        [ "$tool" = synccheck ] && tool_args=(--num-cuda-barriers 8192)
        stage "$tool" compute-sanitizer --tool "$tool" --error-exitcode 1 "${tool_args[@]}" ${SANITIZE_ARGS:-} \
          python3 bench/sanitize_cases.py ${SANITIZE_TIERS:-}
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|========= [A-Z]" "$LOG/$tool.log" | tail -3
        grep -oE "(Race reported|Barrier error|Invalid).* at [A-Za-z_0-9]+" "$LOG/$tool.log" | sort | uniq -c | head
      done ;;
    probe) # synccheck on the cluster exchange in small (diagnostic: never fails the run)
      nvcc -O3 -std=c++17 -arch=sm_90 -I csrc/kernels -I bench/lab bench/lab/cluster_probe.cu -o build/cluster_probe
      for args in "3 8 4" "3 16 4" "16 16 6 late"; do
        for n in 0 8192; do
          compute-sanitizer --tool synccheck --num-cuda-barriers $n --error-exitcode 1 build/cluster_probe $args \
            >"$LOG/probe_n$n.log" 2>&1 # the failure at n = 0 is the finding, not this script's
          echo "synccheck --num-cuda-barriers $n, probe $args: $(grep -hE "^probe|overflow|ERROR SUMMARY" \
            "$LOG/probe_n$n.log" | sed 's/=========//' | tr '\n' ' ')"
        done
      done ;;
    ffma) # the float32 gated grid family (forward by default, backward with PRNN_GATED_FFMA=1): its tests, the
      # default against the persistent family alone (PRNN_GATED_FFMA=0) and the grid family's backward, timings, memcheck
      stage ffmatest python3 -m pytest -q -rfs tests/test_gated_ops.py -k ffma_family
      tail -5 "$LOG/ffmatest.log"
      export AB_CASES="lstm:float32:4:1024 gru:float32:4:1024 lstm:float32:1:256 lstm:float32:8:512 gru:float32:1:512"
      stage ab_persistent env PRNN_GATED_FFMA=0 python3 bench/lab/ab_builds.py persistent "$results/ffma"
      stage ab_default python3 bench/lab/ab_builds.py default "$results/ffma"
      stage ab_ffma env PRNN_GATED_FFMA=1 python3 bench/lab/ab_builds.py ffma "$results/ffma"
      grep -h -E "^(persistent|default|ffma) " "$LOG/ab_persistent.log" "$LOG/ab_default.log" "$LOG/ab_ffma.log" |
        sort -k2,6 -s
      unset AB_CASES
      for c in lstm gru; do
        stage ffma_$c python3 bench/bench.py --cell $c --dtype float32 --batch 1 --batch 4 --batch 8 --out "$results/ffma"
        tail -10 "$LOG/ffma_$c.log"
      done
      stage ffma_memcheck env PRNN_GATED_FFMA=1 compute-sanitizer --tool memcheck --error-exitcode 1 \
        python3 bench/sanitize_cases.py gated
      grep -E "ERROR SUMMARY" "$LOG/ffma_memcheck.log" | tail -1 ;;
    abold) # this build against an older commit's, built here from OLD_TREE (its sources:
      # git archive REV csrc torch_prnn setup.py | tar -x -C build/old), at T = AB_STEPS (default "16 256")
      old_log=$(cd "$LOG" && pwd)/build_old.log old_tree=$(cd "${OLD_TREE:-build/old}" && pwd)
      if (cd "$old_tree" && python3 setup.py build_ext --inplace >"$old_log" 2>&1); then
        for T in ${AB_STEPS:-16 256}; do
          stage ab_old_$T env AB_STEPS=$T PYTHONPATH="$old_tree" python3 bench/lab/ab_builds.py old "$results/ab"
          stage ab_new_$T env AB_STEPS=$T python3 bench/lab/ab_builds.py new "$results/ab"
          grep -h -E "^(old|new) " "$LOG/ab_old_$T.log" "$LOG/ab_new_$T.log" | sort -k2,6 -s
        done
      else
        echo "the old tree did not build: $LOG/build_old.log"; status=1
      fi ;;
    *) echo "unknown stage $s"; status=1 ;;
  esac
done

tar czf "$results/logs.tar.gz" -C "$results" logs && rm -r "$LOG"
echo
printf '%s\n' "${summary[@]}"
exit $status
