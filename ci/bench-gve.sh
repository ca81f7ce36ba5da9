#!/usr/bin/env bash
# Benchmark, one run: TCP receive in a Linux 7.3 guest through the emulated
# gVNIC (kind=gve, vfio-user) versus through its virtio-net port
# (vhost-user), in the same guests from the same sender, and devmem receive
# (into a udmabuf) versus ordinary receive; every receive validated.
#   ci/bench-gve.sh [--bytes 128M] [--rounds 5] [--no-build] [--results DIR]
# The runner is `guest-runner bench-gve` (guest-runner/src/bench_gve.rs,
# one matrix cell); the guest side is ci/guest/bench.sh.
exec "$(dirname "$(readlink -f "$0")")/../scripts/guest-runner" bench-gve "$@"
