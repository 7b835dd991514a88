#!/usr/bin/env bash
# The peers (QuACK, Liger-Kernel, FlashAttention-4, CUTLASS DSL) on a lent GPU, from wheels carried in two calls
# (notes/performance.md, "Carrying the peers"): the cu13 libs' 193 MB .so does not fit one call beside the tree.
#   call 1, carry .whlbig:  bash tools/gpu_peers.sh unpack
#   call 2, carry .whl:     bash tools/gpu_peers.sh install && eval "$(bash tools/gpu_peers.sh env)" && python3 -m course bench ...
#   later calls, same warm machine:  eval "$(bash tools/gpu_peers.sh env)" && ...
set -euo pipefail
case "${1:-}" in
  unpack)
    mkdir -p /tmp/cu13 && tar -xJf .whlbig/ir.tar.xz -C /tmp/cu13 && echo "unpacked the cutlass IR library into /tmp/cu13" ;;
  install)
    [ -d /tmp/cu13 ] || { echo "run 'unpack' first (a call carrying .whlbig) on this machine" >&2; exit 2; }
    pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      --root-user-action=ignore
    tar -xJf .whl/rest.tar.xz -C /tmp/cu13 && cp -a /tmp/cu13/. /tmp/site/ && echo "peers installed in /tmp/site" ;;
  env)  # the wheels' .pth files are not read from a --target folder: the DSL packages go on the path by hand
    echo "export PYTHONPATH=$PWD:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages" ;;
  *)
    echo "usage: bash tools/gpu_peers.sh unpack|install|env" >&2; exit 2 ;;
esac
