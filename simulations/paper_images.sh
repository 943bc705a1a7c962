#!/usr/bin/env bash
# The paper's image trade-off (Figures 4, 5, 12) at its scale: 100 Table III candidates, 5 local epochs, FedAvg
# 5 rounds x 5 epochs (CIFAR-10: 10 x 10), batch 64; both releases with Opt and RandGuess beside them; one CSV and one
# PNG of panels (n, partition). Defaults: Fashion-MNIST, n = 100, iid and Dirichlet 0.5, on CUDA. Resumable: the
# FedAvg ground truth is cached per chunk of candidates and the clients' scores per federation, so running the script
# again after a stop continues where it stopped. Every default is overridden by the environment variable of its name:
#   DATASET (fashion-mnist | cifar10)  DATA_DIR (the data set's folder)  CLIENTS ("50 100 250")
#   BETAS ("iid 0.5 5 30")  CANDIDATES  EPOCHS  ROUNDS  FEDAVG_CHUNK  DEVICE  EPSILONS  REPETITIONS  CACHE  RESULTS
#   PYTHON
set -euo pipefail
DATASET=${DATASET:-fashion-mnist}
DATA_DIR=${DATA_DIR:-/usr/share/datasets/fashion-mnist}
CLIENTS=${CLIENTS:-100}
BETAS=${BETAS:-iid 0.5}
CANDIDATES=${CANDIDATES:-table3}
EPOCHS=${EPOCHS:-}
ROUNDS=${ROUNDS:-$([ "$DATASET" = cifar10 ] && echo 10 || echo 5)}  # Section V-B: CIFAR-10 10 x 10
FEDAVG_CHUNK=${FEDAVG_CHUNK:-25}
DEVICE=${DEVICE:-cuda}
REPETITIONS=${REPETITIONS:-500}
EPSILONS=${EPSILONS:-0.1 0.25 0.5 1 3 inf}
CACHE=${CACHE:-results/cache}
RESULTS=${RESULTS:-results/paper_${DATASET}}
PYTHON=${PYTHON:-python3}
# shellcheck disable=SC2086  # CLIENTS, BETAS and EPSILONS are lists
exec "$PYTHON" -m simulations tradeoff --dataset "$DATASET" --data-dir "$DATA_DIR" --clients $CLIENTS \
    --betas $BETAS --candidates "$CANDIDATES" ${EPOCHS:+--epochs "$EPOCHS"} --rounds "$ROUNDS" --validation split \
    --fedavg-chunk "$FEDAVG_CHUNK" --device "$DEVICE" --release sum argmax \
    --neighbourings replace-one add-remove --epsilons $EPSILONS --repetitions "$REPETITIONS" --cache "$CACHE" --out "$RESULTS" --json
