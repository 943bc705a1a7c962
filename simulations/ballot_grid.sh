#!/usr/bin/env bash
# The ballot grid (docs/ballots.md): every task at n = 10, 20, 50, 100 and 250, iid and Dirichlet 0.5, epsilon 0.5
# and 1, both relations, 5,000 releases per point, every k from 1 to 50. A federation the data do not allow (fewer
# than 10 rows on some client) is refused before any work and skipped. Each federation's arrays are computed once
# into results/cache; a rerun replays them. Each federation's run folder is GRID_OUT/run-TASK-N-PARTITION (GRID_OUT
# default results/ballot-grid). Usage: [SIZES="10 20"] [BETAS=iid] [GRID_OUT=DIR] simulations/ballot_grid.sh TASK...
# (default: every grid task at every size and partition).
# Fashion-MNIST is read from FASHION_DIR (default /usr/share/datasets/fashion-mnist, Debian's dataset-fashion-mnist).
set -u
tasks=("$@")
[ ${#tasks[@]} -gt 0 ] || tasks=(anes96 breast-cancer digits fair randhie fashion-mnist-6k adult digits-1k fair-1k
                                 randhie-1k digits-noisy fair-noisy randhie-3 anes96-noisy fair-2k-noisy
                                 randhie-3-2k-noisy)
for task in "${tasks[@]}"; do
  extra=()
  [ "$task" = fashion-mnist-6k ] && extra=(--data-dir "${FASHION_DIR:-/usr/share/datasets/fashion-mnist}")
  for n in ${SIZES:-10 20 50 100 250}; do
    for beta in ${BETAS:-iid 0.5}; do
      out=${GRID_OUT:-results/ballot-grid}/run-$task-$n-$beta
      [ -f "$out/ksweep.csv" ] && continue
      dphype bench ksweep --dataset "$task" "${extra[@]}" --clients $n --betas $beta --epsilons 0.5 1 \
          --repetitions 5000 --neighbourings replace-one add-remove --ks $(seq 1 50) --ballots auto \
          --cache results/cache --out "$out" || echo "skipped: $task n=$n $beta"
    done
  done
done
